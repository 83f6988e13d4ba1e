"""No two classes in the packages share a name: a reader (or a grep) that finds `Capacity` finds one thing."""
import ast
from collections import defaultdict
from pathlib import Path

from tests.test_layers import PACKAGES, ROOT

PENDING: set[str] = set()  # a name a change in progress still has to part (none)


def _classes(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, list[str]]:
    """Each class name → the files that declare it (nested classes too)."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(str(path.relative_to(root)))
    return found


def test_no_two_classes_share_a_name():
    shared = {name: files for name, files in _classes().items() if len(files) > 1 and name not in PENDING}
    assert shared == {}


def test_the_name_check_finds_a_shared_name(tmp_path):
    for package in ("worker", "report"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "a.py").write_text("class Probe:\n    pass\n")
    assert _classes(tmp_path, ("worker", "report"))["Probe"] == ["worker/a.py", "report/a.py"]
