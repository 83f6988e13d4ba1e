"""No global side effects from the library: the report draws on Figures of its own (a notebook's backend and
pyplot's figures are left alone), and signal handlers are put in place by one module only (protocol/signals.py;
runner/procs.py's launcher holds signals while a role spawns), each given back after."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "cli", "collector", "lab", "models", "protocol", "report", "runner", "scheduler", "simulator",
            "traffic", "worker")
SIGNAL_MODULES = {"protocol/signals.py", "runner/procs.py"}

KEEPS_BACKEND = """
import matplotlib, sys
matplotlib.use("pdf")  # as a notebook's inline backend: whatever the caller chose
import matplotlib.pyplot as plt
from batchlab import api
result = api.simulate({"backend": "sim", "dataset": "synthetic", "duration_s": 1}, sys.argv[1])
report = api.report(result.out)
print(matplotlib.get_backend(), plt.get_fignums(), len(report.plots))
"""


def test_a_report_leaves_the_callers_matplotlib_backend_and_pyplot_alone(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KEEPS_BACKEND, str(tmp_path / "run")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    backend, figures, plots = proc.stdout.split(maxsplit=2)
    assert (backend, figures) == ("pdf", "[]") and int(plots.strip()) >= 4
    assert (tmp_path / "run" / "latency_vs_throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_signal_handlers_are_set_in_one_module():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("signal", "pthread_sigmask") and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "signal"):
                    found.append(rel)
    assert found and set(found) <= SIGNAL_MODULES, sorted(set(found) - SIGNAL_MODULES)


def test_stop_signals_are_declared_once():
    declared = [p.relative_to(ROOT).as_posix() for package in PACKAGES for p in (ROOT / package).rglob("*.py")
                if "STOP_SIGNALS =" in p.read_text()]
    assert declared == ["protocol/signals.py"]
