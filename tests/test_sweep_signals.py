"""A signal to a sweep's whole process group (a closed terminal's SIGHUP, `kill -TERM -PGID`, a Ctrl-C) while a
point runs ends it with one line and 128 + the signal. A hangup once killed multiprocessing's resource tracker,
started by the warm workers' queues without SIGHUP held: its successor printed a KeyError traceback for every
semaphore the run then gave back (193 lines)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, default_sigint
from tests.test_sweep_folder_claim import SWEEP

pytestmark = pytest.mark.slow  # a sweep's processes


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_a_sweeps_group_mid_point_ends_it_with_one_line(tmp_path, sig):
    config, out = tmp_path / "sweep.yaml", tmp_path / "out"
    config.write_text(SWEEP)
    proc = subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", "sweep", str(config), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 180
        while not list(out.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/timing.json")):  # a point's traffic has started
            assert proc.poll() is None and time.monotonic() < deadline, "no point started"
            time.sleep(0.05)
        os.killpg(proc.pid, sig)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, stderr[-3000:]
    once = f"interrupted; run the same command again to resume in {out}"
    assert stderr.strip().splitlines() == [once], stderr[-3000:]
