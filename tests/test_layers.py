"""The layers: no package imports the front end (`cli`), the packages' import graph has no cycle, every
package folder is installed, and only the `batchlab.` names are importable. Imports inside functions
(lazy ones) count as much as those at the top of a module."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "models", "traffic", "worker", "scheduler", "collector", "simulator", "cli")


def _imported(path: Path) -> set[str]:
    """Top-level batchlab packages a module imports anywhere in its body (relative imports stay inside)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {n.split(".")[1] for n in names if n.startswith("batchlab.") and n.split(".")[1] in PACKAGES}
    return found


def _imports() -> dict[Path, set[str]]:
    """Each module of the six packages → the other packages it imports."""
    return {path: _imported(path) - {path.relative_to(ROOT).parts[0]}
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for path, used in _imports().items():
        graph[path.relative_to(ROOT).parts[0]] |= used
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph has none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":  # nxt is on the current path: path + [node] closes at nxt
                on_path = path + [node]
                return on_path[on_path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = "done"
        return []

    for start in PACKAGES:
        if start not in state and (found := visit(start, [])):
            return found
    return []


def test_the_import_walk_sees_every_kind_of_import(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import batchlab.protocol\nfrom batchlab import cli\nimport numpy\n\n\n"
                      "def lazy():\n    from batchlab.worker.sim import SimBackend\n")
    assert _imported(module) == {"protocol", "cli", "worker"}
    assert _graph()["cli"] >= {"protocol", "traffic", "worker", "scheduler", "collector"}


def test_no_package_below_the_front_end_imports_cli():
    offenders = [f"{path.relative_to(ROOT)}" for path, used in _imports().items()
                 if "cli" in used and path.relative_to(ROOT).parts[0] != "cli"]
    assert offenders == []


def test_the_package_import_graph_has_no_cycle():
    assert _cycle(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {p: set() for p in PACKAGES} | {"worker": {"scheduler"}, "scheduler": {"collector"},
                                             "collector": {"worker"}}
    cycle = _cycle(graph)
    assert cycle[0] == cycle[-1] and set(cycle) == {"worker", "scheduler", "collector"}


def test_every_package_folder_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {"batchlab." + ".".join(init.parent.relative_to(ROOT).parts)
               for package in PACKAGES for init in (ROOT / package).rglob("__init__.py")}
    assert folders - listed == set()
    assert {f"batchlab.{p}": p for p in PACKAGES} == config["package-dir"]


def test_only_the_namespaced_packages_are_importable(tmp_path):
    code = ("import importlib.util, batchlab.protocol\n"
            "print(importlib.util.find_spec('protocol') is None, batchlab.protocol.__name__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "batchlab.protocol"]
