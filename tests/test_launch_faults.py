"""Faults around a run's launch and end: two runs started into one folder, a worker lost before it was
ready, a signal to the launcher's whole group at spawn, the start-up limit, a crashing strategy, and a
reader that leaves early. Each run is short (sim or echo backend); every wait polls with a generous
deadline (a busy 2-core machine takes tens of seconds to start a run's processes)."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, default_sigint
from tests.test_process_cleanup import MARKER, marked

pytestmark = pytest.mark.slow
SHORT = ["run", "--backend", "sim", "--strategy", "dynamic", "--dataset", "synthetic", "--max-new-tokens", "16",
         "--max-prompt-len", "64", "--seed", "7"]
WAIT_S = 300  # for a run to end on a loaded machine


def as_a_terminal_job(hup: signal.Handlers = signal.SIG_DFL) -> None:
    """preexec_fn: SIGINT and SIGHUP as a terminal's job gets them (whatever the suite itself inherited, a
    nohup's ignored SIGHUP say), or SIGHUP ignored as under nohup."""
    default_sigint()
    signal.signal(signal.SIGHUP, hup)


def start(args: list[str], *, cwd: Path = ROOT, marker: str = "", hup: signal.Handlers = signal.SIG_DFL
          ) -> subprocess.Popen:
    """`batchlab ARGS` in a session of its own (as a terminal starts a job); stderr kept in a file."""
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *args], cwd=cwd,
                            env={**os.environ, MARKER: marker or uuid.uuid4().hex}, stdout=subprocess.DEVNULL,
                            stderr=err, start_new_session=True, preexec_fn=lambda: as_a_terminal_job(hup))
    proc.err_file = err
    return proc


def ended(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for the command; its exit code and stderr (killed, group and all, past the deadline)."""
    try:
        proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    proc.err_file.seek(0)
    return proc.returncode, proc.err_file.read().decode(errors="replace")


def wait_until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def last_line(stderr: str) -> str:
    return (stderr.strip().splitlines() or [""])[-1]


def every_request_has_its_row(out: Path) -> pd.DataFrame:
    """requests.parquet holds one terminal row per scheduled request, and run.json a final status."""
    schedule, requests = pd.read_parquet(out / "schedule.parquet"), pd.read_parquet(out / "requests.parquet")
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert set(requests.status) <= {"finished", "failed"}
    assert (requests[requests.status == "failed"].error.str.len() > 0).all()
    assert json.loads((out / "run.json").read_text())["status"] != "running"
    return requests


def kill_worker_0_at_start_up(out: Path) -> None:
    """SIGKILL worker-0 half a second after the run's processes were spawned (long before it is ready)."""
    wait_until(lambda: (out / "pids.json").exists(), "pids.json")
    time.sleep(0.5)
    os.kill(json.loads((out / "pids.json").read_text())["worker-0"], signal.SIGKILL)
    assert not (out / "timing.json").exists()  # the traffic had no Start yet: this was start-up


def test_a_worker_killed_during_start_up_leaves_the_others_to_run_it(tmp_path):
    run = start([*SHORT, "--workers", "2", "--rate", "20", "--duration", "2", "--out", str(tmp_path)])
    kill_worker_0_at_start_up(tmp_path)
    code, stderr = ended(run)
    assert code == 2, stderr[-2000:]
    assert last_line(stderr) == "error: worker-0 killed by SIGKILL during start-up; see its log in the out " \
                                "folder's logs/"
    requests = every_request_has_its_row(tmp_path)
    assert set(requests.status) == {"finished"} and set(requests.worker) == {"worker-1"}


def test_the_only_worker_killed_during_start_up_ends_the_run_at_once_naming_it(tmp_path):
    run = start([*SHORT, "--rate", "20", "--duration", "2", "--out", str(tmp_path)])
    kill_worker_0_at_start_up(tmp_path)
    code, stderr = ended(run)
    assert code == 2 and "worker-0 killed by SIGKILL during start-up" in last_line(stderr), stderr[-2000:]
    requests = every_request_has_its_row(tmp_path)
    assert set(requests.status) == {"failed"}
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"


RACE = """
import os, sys, time
from pathlib import Path
import batchlab.cli.main as main
import batchlab.runner.run_folder as run_folder
go = Path(sys.argv[1])

def barrier():  # both runs wait here, then go on within a millisecond of each other
    (go.parent / f"ready-{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.0005)

def claim_together(*args, **kwargs):  # both find the one --out empty, then claim it
    barrier()
    return claim(*args, **kwargs)

def named_together(*args, **kwargs):  # both picked a default name in the same second, then claim it
    name = new_folder(*args, **kwargs)
    barrier()
    return name

claim, new_folder = run_folder.claim, run_folder.new_folder
run_folder.claim, run_folder.new_folder = (claim_together, new_folder) if "--out" in sys.argv else \
    (claim, named_together)
main.app(sys.argv[2:])
"""


@pytest.mark.parametrize("given_out", [True, False], ids=["same-out", "default-name"])
def test_two_runs_started_at_once_never_share_a_folder(tmp_path, given_out):
    go, out = tmp_path / "go", tmp_path / "out"
    args = [*SHORT[1:], "--backend", "echo", "--rate", "10", "--duration", "1"] + (["--out", str(out)] if given_out
                                                                                     else [])
    runs = [subprocess.Popen([sys.executable, "-c", RACE, str(go), "run", *args], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
            for _ in range(2)]
    try:
        wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 2, "both runs at their folder's claim")
        go.touch()
        results = [(r.wait(timeout=WAIT_S), r.stderr.read()) for r in runs]
    finally:
        for r in runs:
            if r.poll() is None:
                os.killpg(r.pid, signal.SIGKILL)
    if given_out:  # one run has the folder; the other is refused in one line before anything starts
        assert sorted(code for code, _ in results) == [0, 1], results
        refused = next(err for code, err in results if code == 1)
        assert last_line(refused).startswith(f"error: --out {out} ") and "Traceback" not in refused
        every_request_has_its_row(out)
    else:  # each gets a folder of its own, both in the same second
        assert [code for code, _ in results] == [0, 0], results
        folders = sorted((tmp_path / "runs").iterdir())
        assert len(folders) == 2
        for folder in folders:
            assert set(every_request_has_its_row(folder).status) == {"finished"}


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["TERM", "HUP"])
def test_a_signal_to_the_launchers_group_at_spawn_keeps_every_row(tmp_path, sig, code):
    """A `kill -TERM -PGID` or a closed terminal (SIGHUP to the foreground group) as the roles spawn: the
    children leave it to the launcher, which stops them in order; the collector writes every row."""
    marker = uuid.uuid4().hex
    run = start([*SHORT, "--rate", "20", "--duration", "3", "--out", str(tmp_path)], marker=marker)
    wait_until(lambda: (tmp_path / "pids.json").exists(), "pids.json")
    os.killpg(run.pid, sig)
    got, stderr = ended(run)
    assert got == code and last_line(stderr) == f"error: interrupted; partial results in {tmp_path}", stderr[-2000:]
    assert "Traceback" not in stderr
    every_request_has_its_row(tmp_path)
    record = json.loads((tmp_path / "run.json").read_text())
    assert (record["status"], record["reason"]) == ("interrupted", signal.Signals(sig).name)
    wait_until(lambda: not marked(marker), "the run's processes to end", 30)


def test_a_hangup_at_spawn_under_nohup_stops_nothing(tmp_path):
    """SIGHUP ignored by whoever started the run (nohup): a hangup as the roles spawn (held in the children
    until they lead their own groups) is ignored there too, and the run ends as if nothing came."""
    marker = uuid.uuid4().hex
    run = start([*SHORT, "--rate", "20", "--duration", "3", "--out", str(tmp_path)], marker=marker,
                hup=signal.SIG_IGN)
    wait_until(lambda: (tmp_path / "pids.json").exists(), "pids.json")
    os.killpg(run.pid, signal.SIGHUP)
    got, stderr = ended(run)
    assert got == 0, stderr[-2000:]
    assert set(every_request_has_its_row(tmp_path).status) == {"finished"}
    wait_until(lambda: not marked(marker), "the run's processes to end", 30)


def test_a_run_past_its_start_up_limit_ends_with_a_row_for_every_request(tmp_path):
    run = start([*SHORT, "--rate", "20", "--duration", "2", "--startup-limit-s", "0.2", "--out", str(tmp_path)])
    code, stderr = ended(run)  # spawning the roles alone takes longer
    assert code == 2 and "start-up passed its limit of 0.2 s" in last_line(stderr), stderr[-2000:]
    assert set(every_request_has_its_row(tmp_path).status) == {"failed"}
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"


def test_a_strategy_raising_in_decide_is_named_in_the_last_line(tmp_path):
    run = start(["run", "--backend", "echo", "--strategy", "tests.fault_plugins:Crash", "--dataset", "synthetic",
                 "--max-new-tokens", "8", "--max-prompt-len", "64", "--rate", "10", "--duration", "1",
                 "--out", str(tmp_path)])
    code, stderr = ended(run)
    assert code == 2, stderr[-2000:]
    assert last_line(stderr).startswith("error: scheduler crashed mid-run: RuntimeError: this policy always fails")
    every_request_has_its_row(tmp_path)


@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_a_reader_that_leaves_after_one_byte_is_no_error_of_the_run(tmp_path, both):
    """`batchlab run … | head -c 1` (and `2>&1 | head -c 1`): the run's own exit code, no traceback."""
    err = tempfile.TemporaryFile()
    run = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *SHORT, "--backend", "echo", "--rate", "10",
                            "--duration", "1", "--out", str(tmp_path / "run")], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT if both else err)
    assert len(run.stdout.read(1)) == 1
    run.stdout.close()  # what head does after its byte
    assert run.wait(timeout=WAIT_S) == 0
    err.seek(0)
    assert "Traceback" not in err.read().decode(errors="replace")
    assert set(every_request_has_its_row(tmp_path / "run").status) == {"finished"}
