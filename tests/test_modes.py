"""A worker's batching mode is protocol.modes.BatchingMode: its values on the wire and in files are the old texts,
and no module of the packages compares a mode with a bare "static" or "continuous"."""
import ast

import yaml

from batchlab.protocol import WorkerHello, decode, encode
from batchlab.protocol.modes import BatchingMode
from tests.test_layers import PACKAGES, ROOT

DECLARED_IN = "protocol/modes.py"
VALUES = {m.value for m in BatchingMode}


def _mode_texts(node: ast.expr) -> bool:
    """Whether an operand is a mode's text, alone or in a tuple (`("hf", "continuous")`)."""
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(isinstance(n, ast.Constant) and n.value in VALUES for n in items)


def _bare_comparisons(rel: str, tree: ast.AST) -> list[str]:
    return [f"{rel}:{node.lineno} {ast.unparse(node)}" for node in ast.walk(tree) if isinstance(node, ast.Compare)
            and any(_mode_texts(operand) for operand in (node.left, *node.comparators))]


def test_the_values_written_are_the_old_texts():
    assert [m.value for m in BatchingMode] == ["static", "continuous"]
    assert all(m == m.value and f"{m}" == m.value for m in BatchingMode)


def test_a_hello_carries_its_mode_as_text_and_a_file_takes_its_value():
    hello = WorkerHello("w0", "sim", "tiny", BatchingMode.CONTINUOUS, 8, 1024, 10**12, "cpu", "none", {})
    back = decode(encode(hello))
    assert type(back.mode) is str and back.mode == BatchingMode.CONTINUOUS
    assert yaml.safe_dump({"mode": BatchingMode.STATIC.value}) == "mode: static\n"


def test_no_mode_is_compared_with_a_bare_string():
    found = [hit for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if (rel := path.relative_to(ROOT).as_posix()) != DECLARED_IN
             for hit in _bare_comparisons(rel, ast.parse(path.read_text()))]
    assert found == []


def test_the_scan_sees_a_bare_mode():
    tree = ast.parse('a = x.mode == "continuous"\nb = (k, m) == ("hf", "static")\nc = m == BatchingMode.STATIC')
    assert len(_bare_comparisons("x.py", tree)) == 2
