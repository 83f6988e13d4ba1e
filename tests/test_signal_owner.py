"""One module owns a process's signal state and handlers (protocol/signals.py), and nothing installs a handler at
import: a process's entry (the command's, a role's, the launcher's, a pool process's) puts them in place."""
import ast
import json
import subprocess
import sys

import pytest

from tests.test_layers import PACKAGES, ROOT

OWNER = "protocol/signals.py"
SETS = {"signal", "pthread_sigmask", "sigtimedwait", "siginterrupt", "set_wakeup_fd"}  # what changes a handler/mask

IMPORT_ALL = """
import importlib, json, signal, sys
from pathlib import Path
root, argv = Path(sys.argv[1]), json.loads(sys.argv[2])
packages = json.loads(sys.argv[3])
sys.argv = argv  # as the command, `python -m`, or a multiprocessing child would have it
watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
before = [signal.getsignal(s) for s in watched]
mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
imported = 0
for package in packages:
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(("batchlab", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        try:
            importlib.import_module(name)
            imported += 1
        except Exception:  # an optional library that is not installed (vllm, ray): not ours to judge
            pass
after = [signal.getsignal(s) for s in watched]
print(json.dumps({"imported": imported, "changed": [str(s) for s, b, a in zip(watched, before, after) if a is not b],
                  "mask": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []) ^ mask))}))
"""


@pytest.mark.parametrize("argv", [["-c"], ["batchlab", "run"], ["-m"], ["python", "--multiprocessing-fork"]],
                         ids=["library", "console-script", "python-m", "spawned-child"])
def test_importing_every_module_installs_no_signal_handler(argv):
    """Whatever the command line says the process is, an import leaves SIGINT, SIGTERM, SIGHUP and the mask."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL, str(ROOT), json.dumps(argv), json.dumps(PACKAGES)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["imported"] > 100 and result["changed"] == [] and result["mask"] == []


def _signal_calls(tree: ast.AST) -> list[int]:
    """Lines that call signal.<one that sets a handler or the mask>."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in SETS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "signal"]


def test_only_protocol_signals_sets_a_handler_or_the_mask():
    found = {rel: lines for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if (rel := path.relative_to(ROOT).as_posix()) != OWNER
             and (lines := _signal_calls(ast.parse(path.read_text())))}
    assert found == {}
    assert _signal_calls(ast.parse((ROOT / OWNER).read_text()))  # the scan sees them where they are


def test_no_module_calls_a_signal_installer_at_its_top_level():
    """A module's top level (its import) calls nothing of protocol.signals; `if __name__ == "__main__":` is an
    entry, not an import."""
    from batchlab.protocol import signals

    owned = {name for name, value in vars(signals).items() if callable(value) and not isinstance(value, type)
             and getattr(value, "__module__", None) == signals.__name__}
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for stmt in ast.parse(path.read_text()).body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
                        isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test)):
                    continue
                found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(stmt) if isinstance(n, ast.Call)
                          and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) in owned]
    assert found == []
