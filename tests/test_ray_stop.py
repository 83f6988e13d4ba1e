"""How a Ray sweep stops, without Ray: a Ctrl-C while the actors stop is held until they have stopped, then
stops the sweep; an inherited ignored SIGINT stays ignored; a local node's daemons are found by TMPDIR too."""
import os
import signal
import subprocess
import time

import psutil
import pytest

from batchlab.lab.ray_cluster import _kill_trees, _node_pids
from batchlab.lab.ray_actor import Ask
from batchlab.lab.ray_sweep import WorkerGroup, stop_all


class Method:
    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self):
        self.calls.append(self.name)
        return self.name


class FakeActor:
    def __init__(self, calls: list) -> None:
        self.stop = Method(calls, "stop")


class FakeRay:
    """ray.get and ray.kill as stop_all uses them; a Ctrl-C lands while the actor stops."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def get(self, ref, timeout=None):
        signal.raise_signal(signal.SIGINT)
        self.calls.append(f"got {ref}")

    def kill(self, actor, no_restart=True):
        self.calls.append("killed")


def stop_one(calls: list[str]) -> list[str]:
    stop_all(FakeRay(calls), [WorkerGroup("naive", Ask({"CPU": 1.0}), [], actor=FakeActor(calls))])
    return calls


@pytest.fixture
def sigint():
    """Python's own Ctrl-C handler while the test runs (importing batchlab.cli alone leaves another)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_while_the_actors_stop_is_raised_once_they_are_stopped_and_the_handler_is_restored(sigint):
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        stop_one(calls)
    assert calls == ["stop", "got stop", "killed"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_sigint_stays_ignored_through_the_stop(sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert stop_one([]) == ["stop", "got stop", "killed"]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def exec_done(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until a child's new image is readable in /proc: Popen returns once the exec has closed its error pipe,
    which is before the kernel has laid out the new image's environment (read empty until then;
    `ray start` has long returned when the product reads its daemons)."""
    deadline = time.monotonic() + timeout_s
    while not psutil.Process(pid).environ():
        assert time.monotonic() < deadline, f"{pid} never showed its environment"
        time.sleep(0.01)


def test_a_node_daemon_that_names_its_folder_only_in_tmpdir_is_one_of_its_pids(tmp_path):
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        exec_done(proc.pid)
        assert proc.pid in _node_pids(tmp_path)
        _kill_trees(_node_pids(tmp_path))
        proc.wait(timeout=30)  # it ended (psutil reaped it, so no exit code is left to read)
    finally:
        proc.kill()
        proc.wait()


class SigtermTakingRay:
    """ray.init as Ray's does it: its own SIGTERM handler in place of the caller's."""

    def __init__(self) -> None:
        self.inits = 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **_kwargs) -> None:
        self.inits += 1
        signal.signal(signal.SIGTERM, lambda signum, _frame: os._exit(signum))


def test_connecting_to_ray_keeps_the_commands_sigterm_handler(monkeypatch):
    from batchlab.lab import ray_cluster
    from batchlab.protocol.signals import terminated_as_interrupt

    fake = SigtermTakingRay()
    monkeypatch.setattr(ray_cluster, "import_ray", lambda: fake)
    with terminated_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        assert ray_cluster.connect("10.0.0.1:6379") is fake and fake.inits == 1
        assert signal.getsignal(signal.SIGTERM) is ours


def test_a_sigterm_re_raised_as_a_plain_ctrl_c_still_exits_143(monkeypatch):
    from batchlab.protocol import signals as cli  # the stop signals' one module
    from batchlab.runner.outcome import interrupted_exit

    monkeypatch.setattr(cli, "_TERMINATED", [])
    assert interrupted_exit(KeyboardInterrupt()) == 130
    with pytest.raises(cli.Terminated):
        cli._terminate(signal.SIGTERM, None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert interrupted_exit(KeyboardInterrupt()) == 143  # what Ray's ray.wait raises in its place
