"""A request's types (docs/architecture.md, "A request's life"): requests.parquet's request columns are the
ones RequestMsg declares, so a field declared there once reaches the table; a request's status and failure
reasons are compared and written only as protocol.status's enums; the store and its tables import no
module back, TYPE_CHECKING imports included."""
import ast
import math
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from batchlab.collector import request
from batchlab.protocol import Arrival, RequestMsg
from batchlab.protocol.status import FailureKind, FailureReason, RequestStatus, detailed
from tests.test_collector import T0, by_id, run_store, script
from tests.test_layers import PACKAGES, ROOT, _modules

STATUS_MODULE = ROOT / "protocol" / "status.py"
REQUEST_TYPES = ("RequestMsg", "RequestRow", "BackendRequest", "HFContinuousRequest", "VLLMRequest", "V0Sequence",
                 "OpenAIStreamRequest", "RequestState", "RequestOutcome", "StoreView", "PublishedPrediction")


def _declared_columns(request_type: type) -> list[str]:
    return [f.name for f in fields(request_type) if f.name != "request_id" and f.metadata.get("column", True)]


def test_the_tables_request_columns_are_the_fields_the_request_message_declares():
    columns = list(request.DTYPES)
    assert sorted(request.REQUEST_COLUMNS) == sorted(_declared_columns(RequestMsg))
    assert columns[:3] == ["request_id", "status", "error"]
    assert columns[3:3 + len(request.REQUEST_COLUMNS)] == list(request.REQUEST_COLUMNS)
    assert "prompt_tokens" not in columns  # declared column: False (schedule.parquet has them)


def test_a_field_declared_once_on_the_request_becomes_a_column_in_its_place():
    @dataclass(slots=True)
    class Prioritised(RequestMsg):
        priority: int = 0
        deadline_time: float = 0.0

    record = request.outcome_type(Prioritised)
    names = [f.name for f in fields(record)]
    # counts, then times, each in declaration order, between the error and the collector's own columns
    assert names[3:9] == ["prompt_len", "output_len", "priority", "arrival_time", "send_time", "deadline_time"]
    row = record(request_id=1, status=RequestStatus.FAILED, error="")
    assert row.priority == 0 and math.isnan(row.deadline_time)  # nothing known: its type's blank


def test_a_request_rows_message_columns_are_copied_from_its_message():
    row = by_id(run_store(script()).finish().requests)[2]
    sent = next(m for m in script() if isinstance(m, Arrival) and m.request.request_id == 2).request
    for name in request.REQUEST_COLUMNS:
        expected = getattr(sent, name) - T0 if name.endswith("_time") else getattr(sent, name)
        assert row[name] == pytest.approx(expected), name


def test_statuses_and_reasons_are_their_strings_in_files():
    assert RequestStatus.FINISHED == "finished" and RequestStatus.FAILED == "failed"
    assert FailureReason.NOT_SENT == "not sent: traffic stopped before its planned time"
    assert detailed(FailureKind.WORKER_LOST, "worker-1") == "worker lost: worker-1"


STATUSES = {str(v) for v in RequestStatus}
VALUES = STATUSES | {str(v) for v in FailureReason}


def _literals(node: ast.AST) -> list[str]:
    """The string constants a comparison's operand is, or holds (a tuple, list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def _bare_statuses(source: str, where: str) -> list[str]:
    """Where a module compares a request status or failure reason with a bare string, or passes one as a
    status/error/reason argument. A "finished"/"failed" compared counts where the other side names a status
    (`df["status"]`, `row.status`): an event's kind, a dict's keys or a summary's fields are not statuses; a
    sweep point's status (protocol.outcomes.RunOutcome, "failed" among them) counts as a request's does."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            of_status = any("status" in ast.unparse(o) for o in operands)
            strings = [s for o in operands for s in _literals(o) if s not in STATUSES or of_status]
        elif isinstance(node, ast.Call):
            strings = [s for k in node.keywords if k.arg in ("status", "error", "reason") for s in _literals(k.value)]
        else:
            continue
        found += [f"{where}:{node.lineno}: {s!r}" for s in strings if s in VALUES]
    return found


def test_no_status_or_failure_reason_is_compared_or_written_as_a_bare_string():
    paths = [p for p in _modules().values() if p != STATUS_MODULE]
    assert [hit for p in paths for hit in _bare_statuses(p.read_text(), p.relative_to(ROOT).as_posix())] == []


def test_the_scan_finds_bare_statuses_and_reasons():
    source = ('def f(df, store, event, reasons):\n    done = df["status"] == "finished"\n'
              '    store.end(status="failed", error="queue full")\n    full = any("queue full" in r for r in reasons)\n'
              '    return {"failed": 1}, df["finished"], event.kind == "finished"\n')
    assert len(_bare_statuses(source, "collector/sample.py")) == 4
    assert len(_bare_statuses('ok = p["status"] != "failed"\n', "lab/sweep_point.py")) == 1


def _imports_with_type_checking(path: Path, modules: dict[str, Path]) -> set[str]:
    """The batchlab modules a module imports anywhere, `if TYPE_CHECKING:` blocks included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
    return {name for name in found if name in modules}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module → the modules it imports), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for other in sorted(graph[module] - {module}):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other, [*path, other])):
                return found
        state[module] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_no_module_imports_itself_back_type_checking_imports_included():
    modules = _modules(ROOT, PACKAGES)
    graph = {name: _imports_with_type_checking(path, modules) for name, path in modules.items()}
    assert _cycle(graph) == []
    assert "batchlab.collector.store" not in graph["batchlab.collector.tables"] | graph["batchlab.collector.merge"]


def test_the_cycle_finder_finds_a_type_checking_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_each_request_type_is_declared_once_under_its_own_name():
    declared = [node.name for path in _modules().values()
                for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]
    assert "Row" not in declared
    assert {name: declared.count(name) for name in REQUEST_TYPES if name != "RequestOutcome"} == \
        dict.fromkeys(set(REQUEST_TYPES) - {"RequestOutcome"}, 1)
    assert request.RequestOutcome.__name__ == "RequestOutcome"  # built from RequestMsg's declaration
