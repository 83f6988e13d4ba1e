"""Faults: killed workers and traffic, restarts, clock skew, intruders, garbage. Nothing may be lost."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pandas as pd
import pytest

from tests.conftest import ROOT

COMMON = ["--backend", "sim", "--dataset", "synthetic", "--max-new-tokens", "64", "--seed", "3"]
pytestmark = pytest.mark.slow


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_leftovers():
    """A test that fails half way must not leave its processes running into the next tests."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    """A batchlab command in the background, in its own process group; its output goes to files (a
    full pipe would block it)."""
    proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=tempfile.TemporaryFile(), stderr=(err := tempfile.TemporaryFile()),
                            start_new_session=True)
    proc.err_file = err
    STARTED.append(proc)
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    proc.err_file.seek(0)
    return proc.err_file.read().decode(errors="replace")


def wait_for(path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def assert_conserved(out) -> pd.DataFrame:
    """Every scheduled request has exactly one terminal row, finished with all its tokens or failed with a reason."""
    schedule, requests = pd.read_parquet(out / "schedule.parquet"), pd.read_parquet(out / "requests.parquet")
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert set(requests.status) <= {"finished", "failed"}
    failed = requests[requests.status == "failed"]
    assert (failed.error.str.len() > 0).all()
    done = requests[requests.status == "finished"]
    assert (done.n_tokens == done.output_len).all()
    return requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigkill_of_one_worker_mid_batch_requeues_its_requests_and_the_run_ends(tmp_path):
    run = start("run", *COMMON, "--strategy", "dynamic", "--workers", "2", "--rate", "25", "--duration", "5",
                "--out", str(tmp_path))
    wait_for(tmp_path / "pids.json")
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".parts/batches-*")):  # batches are running: both workers are busy
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(json.loads((tmp_path / "pids.json").read_text())["worker-0"], signal.SIGKILL)
    run.wait(timeout=120)
    assert run.returncode == 2 and "worker-0 killed by SIGKILL mid-run" in stderr_of(run)  # the run goes on, and says so
    requests = assert_conserved(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["scheduler_stats"]["workers_lost"] == 1
    assert (requests.attempts == 2).any()  # something was in flight on the dead worker and was retried
    assert set(requests[requests.attempts == 2].worker) == {"worker-1"}


def test_killing_the_traffic_process_ends_the_run_on_its_own(tmp_path):
    run = start("run", *COMMON, "--strategy", "continuous", "--rate", "10", "--duration", "30",
                "--out", str(tmp_path))
    wait_for(tmp_path / "pids.json")
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".parts/requests-*")):  # requests are flowing
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(json.loads((tmp_path / "pids.json").read_text())["traffic"], signal.SIGKILL)
    run.wait(timeout=120)
    assert run.returncode == 2 and "traffic killed by SIGKILL mid-run" in stderr_of(run)
    requests = assert_conserved(tmp_path)
    assert (requests.status == "finished").sum() > 5
    assert requests[requests.status == "failed"].error.str.startswith("not sent").all()
    assert (requests.status == "failed").sum() > 100


def test_traffic_killed_before_its_hello_still_ends_the_run(tmp_path):
    run = start("run", *COMMON, "--strategy", "dynamic", "--rate", "10", "--duration", "5", "--out", str(tmp_path))
    wait_for(tmp_path / "pids.json")
    os.kill(json.loads((tmp_path / "pids.json").read_text())["traffic"], signal.SIGKILL)
    run.wait(timeout=120)
    assert run.returncode == 2 and "traffic killed by SIGKILL" in stderr_of(run)
    requests = assert_conserved(tmp_path)
    assert set(requests.status) == {"failed"}


def roles(tmp_path, extra_worker_env: dict | None = None, keys: list[str] | None = None):
    """Collector, scheduler and one worker as separate commands on loopback TCP, like a remote setup."""
    sched, coll = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    k = keys or []
    procs = {"collector": start("collector", "--address", coll, "--out", str(tmp_path), *k)}
    procs["scheduler"] = start("scheduler", "--strategy", "dynamic", "--address", sched, "--collector", coll,
                               "--out", str(tmp_path), *k)
    procs["worker"] = start("worker", "--backend", "sim", "--scheduler", sched, "--collector", coll,
                            "--out", str(tmp_path), *k, env=extra_worker_env)
    return sched, coll, procs


def finish(procs: dict, timeout_s: float = 120) -> None:
    for name in ("traffic", "scheduler", "worker", "collector"):
        if name in procs:
            procs[name].wait(timeout=timeout_s)
            assert procs[name].returncode in (0, None), f"{name}: {stderr_of(procs[name])[-2000:]}"


def test_a_restarted_worker_rejoins_and_nothing_is_lost(tmp_path):
    sched, coll, procs = roles(tmp_path)
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "8", "--duration", "6", "--scheduler", sched,
                             "--out", str(tmp_path))
    time.sleep(4.0)
    procs["worker"].kill()
    procs["worker"].wait()
    time.sleep(1.0)
    procs["worker"] = start("worker", "--backend", "sim", "--scheduler", sched, "--collector", coll,
                            "--out", str(tmp_path))
    finish(procs)
    requests = assert_conserved(tmp_path)
    assert (requests.status == "finished").mean() > 0.8


def test_a_worker_with_a_skewed_clock_still_stamps_on_the_scheduler_clock(tmp_path):
    sched, coll, procs = roles(tmp_path, extra_worker_env={"BATCHLAB_CLOCK_SKEW_S": "500"})
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "10", "--duration", "2", "--scheduler", sched,
                             "--out", str(tmp_path))
    finish(procs)
    requests = assert_conserved(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    clock = summary["worker_stats"]["worker-0"]
    assert clock["clock_offset_s"] == pytest.approx(-500, abs=0.05)
    slack = clock["clock_uncertainty_s"] + 1e-3
    assert (requests.first_token_time > requests.scheduled_time - slack).all()
    assert (requests.first_token_time - requests.scheduled_time).max() < 50  # a tenth of the skew


def test_a_client_without_keys_gets_nothing_through_and_the_run_is_unaffected(tmp_path):
    import zmq

    from batchlab.protocol import RequestMsg, encode
    from batchlab.protocol.security import generate_keys

    keys = generate_keys(tmp_path / "keys")
    sched, coll, procs = roles(tmp_path / "run", keys=["--keys", str(keys)])
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "10", "--duration", "2", "--scheduler", sched,
                             "--out", str(tmp_path / "run"), "--keys", str(keys))
    ctx = zmq.Context()
    intruders = [ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)]  # the scheduler's and the collector's kind of peer
    intruders[0].connect(sched)
    intruders[1].connect(coll)
    for i in range(200):
        for s in intruders:
            try:
                s.send(encode(RequestMsg(10_000 + i, 0.0, 0.0, 5, 5)), zmq.NOBLOCK)
            except zmq.Again:  # the handshake was refused and no pipe is up just now: nothing went out either
                pass
        time.sleep(0.005)
    reply = intruders[0].poll(500)
    for s in intruders:
        s.close(linger=0)
    ctx.term()
    finish(procs)
    assert reply == 0
    requests = assert_conserved(tmp_path / "run")
    assert requests.request_id.max() < 10_000 and set(requests.status) == {"finished"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rejected_messages"] == 0 and summary["scheduler_stats"]["rejected_messages"] == 0


def test_a_worker_started_before_the_scheduler_waits_and_joins(tmp_path):
    sched, coll = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    procs = {"worker": start("worker", "--backend", "sim", "--scheduler", sched, "--collector", coll)}
    time.sleep(5.0)  # longer than the old 3 s liveness limit: an impatient worker would have given up
    assert procs["worker"].poll() is None
    procs["collector"] = start("collector", "--address", coll, "--out", str(tmp_path))
    procs["scheduler"] = start("scheduler", "--address", sched, "--collector", coll, "--out", str(tmp_path))
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "10", "--duration", "1", "--scheduler", sched,
                             "--out", str(tmp_path))
    finish(procs)
    assert set(assert_conserved(tmp_path).status) == {"finished"}
