"""No global side effects from the library: the report draws on Figures of its own (a notebook's backend and
pyplot's figures are left alone), and signal handlers are put in place by one module only (protocol/signals.py,
which also holds signals while the launcher spawns a role), each given back after."""
import ast
import os
import subprocess
import sys

from tests.test_layers import PACKAGES, ROOT

SIGNAL_MODULES = {"protocol/signals.py"}

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


HANDLED_IN_EXEC = """
import os, signal, sys
from batchlab.protocol.signals import forget_handled_interrupt
try:  # a Ctrl-C while a module's dataclass is being made: it passes through an exec() of a string
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10 ** 7): pass")
except KeyboardInterrupt:
    pass  # handled: the command chooses its exit code
if sys.argv[1] == "forget":
    forget_handled_interrupt()
sys.exit(130)
"""


def test_a_ctrl_c_handled_after_an_exec_keeps_the_commands_exit_code_under_python_m(tmp_path):
    """CPython 3.11's flag (gh-128130): under `python -m` a KeyboardInterrupt caught after it passed through exec()
    made the interpreter kill itself with SIGINT at exit; cli.main's main() forgets it once the code is chosen."""
    import signal

    (tmp_path / "handled_in_exec.py").write_text(HANDLED_IN_EXEC)
    codes = {how: subprocess.run([sys.executable, "-m", "handled_in_exec", how], cwd=tmp_path, capture_output=True,
                                 env={**os.environ, "PYTHONPATH": str(tmp_path)},
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                                 timeout=60).returncode for how in ("keep", "forget")}
    if sys.version_info < (3, 13):  # the flag is a symbol of the interpreter up to 3.12
        assert codes["keep"] == -signal.SIGINT  # what a user's `python -m batchlab.cli.main run` met
    assert codes["forget"] == 130


def test_a_ctrl_c_a_library_swallowed_is_raised_again_where_the_launcher_checks():
    """A library's bare except took the KeyboardInterrupt (numpy's Cython set-up, under pandas' import): the run
    went on to exit 0. The noted signal is raised again at the launcher's checks, only while a command runs."""
    import signal

    import pytest

    from batchlab.protocol.signals import Terminated, raise_if_stopped, terminated_as_interrupt

    before = {sig: signal.signal(sig, handler) for sig, handler in
              ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))}
    try:
        for sig, raised in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)):
            with terminated_as_interrupt():
                raise_if_stopped()  # nothing came yet
                try:
                    signal.raise_signal(sig)
                except KeyboardInterrupt:  # Terminated is one too
                    pass  # swallowed
                with pytest.raises(raised):
                    raise_if_stopped()
            raise_if_stopped()  # the command ended: a later library call (a notebook's) is not stopped by it
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
