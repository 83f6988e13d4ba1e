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


def test_the_command_gives_ctrl_c_to_python_only_inside_typers_main_and_ends_quietly_after(tmp_path, monkeypatch):
    """A Ctrl-C while the command imports or once it has ended is a quiet exit 130; Python's own (a
    KeyboardInterrupt, which typer's main makes 130) only from inside that main: given back when the module
    ended, a Ctrl-C before typer's try was a traceback and a death by SIGINT (a fault-matrix cell saw it)."""
    import signal

    from batchlab.cli import main as cli
    from batchlab.protocol import signals

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal gives it (xdist ignores it)
    seen = []
    invoke = cli._OneLineErrors.invoke
    monkeypatch.setattr(cli._OneLineErrors, "invoke",
                        lambda self, ctx: seen.append(signal.getsignal(signal.SIGINT)) or invoke(self, ctx))
    monkeypatch.setattr(sys, "argv", ["batchlab", "keys", "generate", str(tmp_path / "keys")])
    try:
        signals.exit_on_sigint_while_importing()  # what the command's import does
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        try:
            cli.main()
        except SystemExit as exc:
            assert exc.code in (0, None)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert seen == [signal.default_int_handler]  # Python's own while the command ran
    assert after is not signal.default_int_handler and callable(after)  # quiet again once it ended
    assert (tmp_path / "keys").is_dir()
