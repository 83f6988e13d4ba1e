"""The layers: a package imports only the packages its row of LAYERS allows (none below the front end
imports `cli`), no module imports itself back through others, every package folder is installed, and
only the `batchlab.` names are importable. Imports inside functions (lazy ones) count as much as those at
the top of a module; those under `if TYPE_CHECKING:` (annotations, never run) do not."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# package → the packages it may import (docs/architecture.md's layer table)
LAYERS: dict[str, set[str]] = {
    "protocol": set(),
    "models": {"protocol"},
    "traffic": {"protocol", "models"},
    "scheduler": {"protocol"},
    "worker": {"protocol", "models"},
    "stats": {"protocol"},
    "collector": {"protocol", "stats"},
    "report": {"protocol", "stats", "collector"},
    "simulator": {"protocol", "models", "traffic", "scheduler", "worker", "stats", "collector"},
    "runner": {"protocol", "models", "traffic", "scheduler", "worker", "stats", "collector", "simulator"},
    "lab": {"protocol", "models", "traffic", "scheduler", "worker", "stats", "collector", "report", "simulator",
            "runner"},
    "api": {"protocol", "models", "traffic", "scheduler", "worker", "stats", "collector", "report", "simulator",
            "runner", "lab"},
    "cli": {"protocol", "models", "traffic", "scheduler", "worker", "stats", "collector", "report", "simulator",
            "runner", "lab", "api"},
}
PACKAGES = tuple(LAYERS)


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package's __init__ by the package's)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(("batchlab", *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def _imported(path: Path, modules: dict[str, Path]) -> set[str]:
    """The batchlab names a module imports anywhere in its body but under `if TYPE_CHECKING:`; `from M
    import n` names M.n when that is a module, else M."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
    return {name for name in found if name.startswith("batchlab.")}


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module → the other modules it imports."""
    return {name: (_imported(path, modules) & modules.keys()) - {name} for name, path in modules.items()}


def _package(module: str) -> str:
    return module.split(".")[1]


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as [a, b, ..., a], or [] when the graph has none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":  # nxt is on the current path: path + [node] closes at nxt
                on_path = path + [node]
                return on_path[on_path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return []


def test_the_import_walk_sees_every_kind_of_import_but_annotations(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("import batchlab.protocol\nfrom batchlab import cli\nfrom batchlab.worker.sim import SimBackend\n"
                      "import numpy\nif TYPE_CHECKING:\n    from batchlab.collector.store import RunStore\n\n\n"
                      "def lazy():\n    from batchlab.models import folders\n")
    assert _imported(module, _modules()) == {"batchlab.protocol", "batchlab.cli", "batchlab.worker.sim",
                                             "batchlab.models.folders"}
    imported = set().union(*_graph(_modules()).values())  # every package is some module's import
    assert {_package(m) for m in imported} == set(PACKAGES)


def test_each_package_imports_only_what_its_layer_allows():
    offenders = sorted(f"{module} → {used}" for module, imports in _graph(_modules()).items() for used in imports
                       if _package(used) not in LAYERS[_package(module)] | {_package(module)})
    assert offenders == []


def test_the_layers_have_no_cycle_and_none_below_the_front_end_imports_cli():
    assert _cycle(LAYERS) == []
    assert [p for p, allowed in LAYERS.items() if "cli" in allowed] == []


def test_no_module_imports_itself_back_through_others():
    assert _cycle(_graph(_modules())) == []


def test_the_cycle_finder_finds_a_module_cycle_hidden_in_a_function(tmp_path):
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "a.py").write_text("from batchlab.worker.b import f\n")
    (tmp_path / "worker" / "b.py").write_text("def f():\n    from batchlab.worker import c\n")
    (tmp_path / "worker" / "c.py").write_text("import batchlab.worker.a\nimport batchlab.protocol\n")
    cycle = _cycle(_graph(_modules(tmp_path, ("worker",))))
    assert cycle[0] == cycle[-1] and set(cycle) == {"batchlab.worker.a", "batchlab.worker.b", "batchlab.worker.c"}


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


def test_importing_the_library_installs_no_signal_handler():
    library = sorted(m for m in _modules() if _package(m) in ("runner", "lab", "report"))
    code = ("import importlib, signal, sys\n"
            "sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)\n"
            "before = [signal.getsignal(s) for s in sigs]\n"
            "for name in sys.argv[1:]:\n    importlib.import_module(name)\n"
            "print([signal.getsignal(s) for s in sigs] == before, 'batchlab.cli' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, *library], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"]


def test_the_schedulers_process_imports_no_pandas():
    """Each run spawns its scheduler afresh: pandas, which it never uses, cost it 0.16 s of CPU at every start."""
    code = ("import sys\nimport batchlab.runner.launcher, batchlab.runner.roles, batchlab.scheduler.process\n"
            "print('pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
