"""Other tools' result files beside batchlab's strategies, told apart by their content: `vllm bench serve
--save-result` JSON (also --append-result's one result per line, `vllm bench sweep`'s summary.json and batchlab's
own --save-result), GuideLLM's benchmarks.json and AIPerf's profile_export_aiperf.json (report.peer_vllm,
peer_guidellm, peer_aiperf read each; report.peer_point is what they give).

A file is read whole or refused: one line naming it and what it is (unreadable, nested too deep, a format of
no tool, a corrupt file of a tool) for every bad file given with --extra or lying in the report's folder, then
exit 1. A JSON file in the folder of no tool's format is left alone (batchlab's own summary.json, a config).
"""
import json
import math
from pathlib import Path

from batchlab.protocol.run_dir import RunDir
from batchlab.report import peer_aiperf, peer_guidellm, peer_vllm
from batchlab.report.peer_point import ExternalPoint, Figure, not_finite_lines
from batchlab.report.points import ReportError

__all__ = ["ExternalPoint", "Figure", "load_external", "points_of", "DEFINITIONS", "ACCEPTED"]

ACCEPTED = ("vllm bench serve --save-result JSON (also --append-result's lines, vllm bench sweep's summary.json "
            "and batchlab's own --save-result), GuideLLM's JSON report (guidellm run --output kind=json,path=FILE), "
            "AIPerf profile_export_aiperf.json")
# each tool's definitions where they differ from batchlab's (TTFT from arrival at the scheduler, TPOT
# (completion − first token) ÷ (tokens − 1) per request, ITL the gaps between consecutive tokens)
DEFINITIONS = {peer_vllm.KIND: peer_vllm.DEFINITION, peer_vllm.OWN: peer_vllm.OWN_DEFINITION,
               peer_guidellm.KIND: peer_guidellm.DEFINITION, peer_aiperf.KIND: peer_aiperf.DEFINITION}
MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError, RecursionError)
FOUND_SUFFIXES = ("*.json", "*.jsonl")


class Unreadable(ValueError):
    """A file that is no JSON (nor JSON lines) batchlab can read: why, in a few words."""


def _parse(text: str) -> object:
    """One JSON document; Unreadable for anything else (a RecursionError too: nesting no result file has)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Unreadable("JSON nested deeper than Python can read (no result file is)") from None


def read(path: Path) -> object:
    """A file's JSON, or its JSON lines as [(line number, value), ...] (vLLM's --append-result); Unreadable
    naming why otherwise."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"cannot read it ({exc})") from None
    try:
        return _parse(text)
    except json.JSONDecodeError as exc:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if exc.msg != "Extra data" or len(lines) < 2:
            raise Unreadable(f"not JSON ({exc}): cut short or not a result file") from None
    try:
        return JsonLines((n, _parse(line)) for n, line in lines)
    except json.JSONDecodeError as exc:
        raise Unreadable(f"not JSON, nor one JSON value per line ({exc})") from None


class JsonLines(list):
    """A file of one JSON value per line: [(line number, value), ...]."""


def points_of(path: Path, data: object) -> list[ExternalPoint] | None:
    """The points of one file's content of a format batchlab reads; None for any other content; ValueError
    (or another of MALFORMED) for a file of such a format that is corrupt."""
    if isinstance(data, JsonLines):
        return peer_vllm.from_lines(path, data)
    if (found := peer_vllm.points(path, data)) is not None:
        return found
    if peer_guidellm.is_guidellm(data):
        return _figured(peer_guidellm.points(path, data))
    if peer_aiperf.is_aiperf(data):
        return _figured([peer_aiperf.point(path, data)])
    return None


def _figured(points: list[ExternalPoint]) -> list[ExternalPoint]:
    """The points, each with at least one figure (ValueError for a run of the format holding none)."""
    for p in points:
        if math.isnan(p.throughput_tok_s) and all(v is None for q in p.latency.values() for v in q.values()):
            raise ValueError(f"{p.head} holds no figure batchlab reads")
    return points


def _what(data: object) -> str:
    """The format a corrupt file claims to be, for its line."""
    if isinstance(data, JsonLines) or peer_vllm.is_result(data) or peer_vllm.is_sweep_summary(data):
        return "vLLM result"
    return "GuideLLM report" if peer_guidellm.is_guidellm(data) else "AIPerf export"


def _points(path: Path, origin: str, found: bool) -> list[ExternalPoint]:
    """The points of one file; ReportError (one line naming it and what it is) when it is refused. `found`:
    lying in the folder, where a JSON file of no tool's format is left alone ([])."""
    try:
        data = read(path)
    except Unreadable as exc:
        raise ReportError(f"{origin} {path}: {exc}; batchlab reads {ACCEPTED}") from None
    try:
        points = points_of(path, data)
    except MALFORMED as exc:
        raise ReportError(f"{origin} {path}: a corrupt {_what(data)} ({type(exc).__name__}: {exc})") from None
    if points is None and not found:
        raise ReportError(f"{origin} {path}: {_unknown(data)}; batchlab reads {ACCEPTED}")
    if points and (bad := not_finite_lines(data)):  # a figure of inf or NaN: said, never a silent '-'
        points[0].not_finite = bad
    return points or []


def _unknown(data: object) -> str:
    """What a file of no format batchlab reads is, as far as its keys tell."""
    if isinstance(data, dict) and {"finished", "scheduled", "throughput_tok_s"} <= set(data):
        return "a batchlab run's summary.json, not another tool's result (report its run folder instead)"
    if isinstance(data, dict) and "points" in data and "rates" in data:
        return "a batchlab sweep's index.json, not another tool's result (report its sweep folder instead)"
    return "not a result file of a tool batchlab reads"


def _found_files(folder: Path, given: set[Path]) -> list[Path]:
    """The JSON files directly in `folder` to look at: not given, not the folder's own vllm_result.json."""
    if not folder.is_dir():
        return []
    own = RunDir(folder).vllm_result.resolve()
    files = sorted({p for pattern in FOUND_SUFFIXES for p in folder.glob(pattern) if p.is_file()})
    return [p for p in files if p.resolve() not in given and p.resolve() != own]


def load_external(folder: str | Path, files: list[str] | None = None) -> list[ExternalPoint]:
    """The files given (each must be of a format batchlab reads), then such results among the JSON files
    directly in `folder` (others are left alone), by rate then label; ReportError with one line per refused
    file, given or found."""
    given = list(dict.fromkeys(Path(f) for f in files or []))
    resolved = {p.resolve() for p in given}
    points, problems = [], []
    for path, origin, found in ([(p, "--extra", False) for p in given]
                                + [(p, "in the report's folder:", True) for p in _found_files(Path(folder), resolved)]):
        try:
            points += _points(path, origin, found)
        except ReportError as exc:
            problems += exc.lines
    if problems:
        raise ReportError(*problems)
    unique_labels(points)
    return sorted(points, key=lambda p: (p.rate if not math.isnan(p.rate) else math.inf, p.label))


def _label(point: ExternalPoint, depth: int, where: bool) -> str:
    """Its head, then its file's last `depth` path parts without the suffix (and which run of it, `where`)."""
    tag = "/".join(point.source.resolve().with_suffix("").parts[-depth:])
    return f"{point.head} [{tag}, {point.where}]" if where and point.where else f"{point.head} [{tag}]"


def unique_labels(points: list[ExternalPoint]) -> None:
    """Give each point a label no other point has: its head and its file's name; where two clash, which run of
    its file it is (line 2, benchmark 3 of 4), then as many of the file's folders as tell two files of one name
    apart (gl1/benchmarks, gl2/benchmarks)."""
    depth, where = {id(p): 1 for p in points}, {id(p): False for p in points}
    for _ in range(2 + max((len(p.source.resolve().parts) for p in points), default=0)):
        labels: dict[str, list[ExternalPoint]] = {}
        for p in points:
            labels.setdefault(_label(p, depth[id(p)], where[id(p)]), []).append(p)
        clashes = [group for group in labels.values() if len(group) > 1]
        if not clashes:
            break
        for group in clashes:
            unnamed = [p for p in group if p.where and not where[id(p)]]
            for p in unnamed or group:
                if unnamed:
                    where[id(p)] = True
                else:
                    depth[id(p)] += 1
    seen: dict[str, int] = {}
    for p in points:
        label = _label(p, depth[id(p)], where[id(p)])
        seen[label] = seen.get(label, 0) + 1
        p.label = label if seen[label] == 1 else f"{label} #{seen[label]}"
