"""A stalled collector (SIGSTOP) cannot hang a run. Stopped for less than the liveness window, mid-run or right
at spawn, it loses nothing: the other roles keep their sockets until it acknowledged their last record
(CollectorAck), the traffic starts only once it answered, and the run exits 0 with a row for every request.
Stopped for good, the run ends at the start-up limit (at spawn) or after the liveness window (mid-run), exit 2,
run.json saying why, and nothing of it is left running.

The echo backend at 300 req/s sends more during a stall than the kernel's socket buffers hold: before the
acknowledgements, the roles' last frames (RunEnd, the byes) were dropped when they closed, and the run hung."""
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
RUN = ["run", "--backend", "echo", "--dataset", "synthetic", "--max-prompt-len", "64", "--rate", "300", "--duration",
       "3", "--seed", "3"]
WAIT_S = 240.0  # generous: every wait ends as soon as its condition holds


def wait_until(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def stall_collector(out: Path, *options: str, moment: str, stop_s: float | None) -> tuple[int, str, float]:
    """`batchlab run` with its collector stopped at `moment` ("spawn": as soon as the roles are started;
    "mid": 1 s into the traffic) for `stop_s` seconds (None: for good); (exit code, stderr, seconds from the
    stop to the run's end). Nothing the run started may outlive it."""
    marker, err = uuid.uuid4().hex, tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *RUN, *options, "--out", str(out)], cwd=ROOT,
                            env={**os.environ, MARKER: marker}, stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        wait_until(lambda: (out / "pids.json").exists(), "the roles' start")
        collector = json.loads((out / "pids.json").read_text())["collector"]
        if moment == "mid":
            wait_until(lambda: (out / "timing.json").exists(), "the traffic's start")
            time.sleep(1.0)
        os.kill(collector, signal.SIGSTOP)
        stopped = time.monotonic()
        if stop_s is not None:
            time.sleep(stop_s)
            os.kill(collector, signal.SIGCONT)
        proc.wait(timeout=WAIT_S)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 5  # a process killed at the run's end may take a moment to be gone
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = marked(marker)
        for p in left:
            p.kill()
    err.seek(0)
    assert not left, f"processes left behind: {[p.pid for p in left]}"
    return proc.returncode, err.read().decode(errors="replace"), took


def assert_every_row_finished(out: Path) -> None:
    schedule, requests = (pd.read_parquet(out / f"{t}.parquet") for t in ("schedule", "requests"))
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert set(requests.status) == {"finished"}, requests.error.value_counts().to_dict()
    assert json.loads((out / "run.json").read_text())["status"] == "done"


def test_a_collector_stopped_mid_run_for_25_s_loses_nothing(tmp_path):
    code, stderr, _ = stall_collector(tmp_path / "run", moment="mid", stop_s=25.0)  # inside the 30 s liveness
    assert code == 0, stderr[-2000:]
    assert_every_row_finished(tmp_path / "run")


def test_a_collector_stopped_at_spawn_for_12_s_loses_nothing(tmp_path):
    code, stderr, _ = stall_collector(tmp_path / "run", moment="spawn", stop_s=12.0)
    assert code == 0, stderr[-2000:]
    assert_every_row_finished(tmp_path / "run")


def test_a_collector_stopped_for_good_at_spawn_ends_the_run_at_the_start_up_limit(tmp_path):
    code, stderr, took = stall_collector(tmp_path / "run", "--startup-limit-s", "8", moment="spawn", stop_s=None)
    assert code == 2, stderr[-2000:]
    assert "start-up passed its limit of 8 s: the collector gave no sign of life" in stderr.strip().splitlines()[-1]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "failed" and "the collector gave no sign of life" in record["reason"]
    assert took < 8 + 60  # the limit, then the roles' stop: a stopped collector is not waited for


def test_a_collector_stopped_for_good_mid_run_ends_the_run_after_the_liveness_window(tmp_path):
    code, stderr, took = stall_collector(tmp_path / "run", "--liveness-s", "5", moment="mid", stop_s=None)
    assert code == 2, stderr[-2000:]
    assert "collector stalled mid-run: no sign of life for" in stderr.strip().splitlines()[-1]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "failed" and "collector stalled" in record["reason"]
    assert took < 5 + 60
