"""The end of the stream loses nothing: the traffic keeps its socket until the scheduler took its
EndOfStream, so frames still queued when it finished sending reach a scheduler that was stopped for
less than the liveness window. A whole `batchlab run` on the echo backend; the same path at a high rate,
in-process with a small receive queue: tests/test_traffic_process.py."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pandas as pd
import pytest

from tests.conftest import ROOT
from tests.test_fault_matrix import alive, wait_until
from tests.test_launch_faults import ended

pytestmark = pytest.mark.slow
ECHO = ["run", "--backend", "echo", "--dataset", "synthetic", "--seed", "7"]


def start_run(out, *args: str) -> subprocess.Popen:
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *ECHO, *args, "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    proc.err_file = err
    return proc


def assert_every_request_finished(out) -> pd.DataFrame:
    schedule, requests = (pd.read_parquet(out / f"{t}.parquet") for t in ("schedule", "requests"))
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert not requests.error.fillna("").str.startswith("not sent").any(), requests.error.value_counts().to_dict()
    assert set(requests.status) == {"finished"}, requests.error.value_counts().to_dict()
    return requests


def test_a_scheduler_stopped_for_8_s_within_the_liveness_window_loses_no_request(tmp_path):
    out = tmp_path / "run"
    proc = start_run(out, "--rate", "100", "--duration", "3")
    wait_until(lambda: (out / "timing.json").exists(), 240, "the traffic's Start")
    scheduler = json.loads((out / "pids.json").read_text())["scheduler"]
    time.sleep(1.0)  # the fault's moment: 1 s into the 3 s of sending
    os.kill(scheduler, signal.SIGSTOP)
    try:
        time.sleep(8.0)  # the stall: past the traffic's last send and its old 2 s linger, within 30 s
    finally:
        if alive(scheduler):
            os.kill(scheduler, signal.SIGCONT)
    code, stderr = ended(proc)
    assert code == 0, stderr[-2000:]
    assert_every_request_finished(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scheduler_stats"]["sent_by_traffic"] == summary["scheduled"]

