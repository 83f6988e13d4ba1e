"""A sweep's and a capacity search's --out is claimed as a run's folder is: a second one started into it while
the first goes is refused in one line (before, both ran and deleted each other's point folders); once the
first ended, a later one resumes it."""
import json
import subprocess
import sys
import time

import pytest

from batchlab.runner.run_folder import held
from tests.conftest import ROOT, run_cli

SWEEP = """\
base: {backend: sim, preset: cpu-tiny-mistral, dataset: synthetic, duration_s: 2, max_new_tokens: 8,
       max_prompt_len: 64, warmup_requests: 0}
grid: {strategies: [continuous, dynamic], rates: [4], repeats: 1, seed: 0}
"""


def test_a_folder_held_by_a_sweep_refuses_another_process_and_is_free_once_it_ended(tmp_path):
    out = tmp_path / "sweep"
    other = [sys.executable, "-c", "from batchlab.runner.run_folder import held\n"
             f"with held({str(out)!r}, 'sweep'): pass"]
    with held(out, "sweep"):
        refused = subprocess.run(other, capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0 and "is in use by another sweep or run that is still going" in refused.stderr
        with held(out, "sweep"):  # this process's own claim: a nested use (a test, a command run twice) is allowed
            pass
    assert subprocess.run(other, capture_output=True, text=True, timeout=120).returncode == 0


def test_a_run_into_a_held_sweep_folder_is_refused(tmp_path):
    out = tmp_path / "sweep"
    script = (f"from batchlab.runner.run_folder import claim\nclaim({str(out)!r}, overwrite=True)")
    with held(out, "capacity search"):
        refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "in use by another run that is still going" in refused.stderr


@pytest.mark.slow  # two sweeps' processes
def test_two_sweeps_into_one_folder_one_is_refused_in_one_line_and_a_resume_after_it_is_allowed(tmp_path):
    config, out = tmp_path / "sweep.yaml", tmp_path / "out"
    config.write_text(SWEEP)
    command = [sys.executable, "-m", "batchlab.cli.main", "sweep", str(config), "--out", str(out)]
    first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(out.glob("sweep_label=*")):  # the first one holds the folder and runs its points
            assert first.poll() is None and time.monotonic() < deadline, "the first sweep never started a point"
            time.sleep(0.05)
        second = run_cli("sweep", str(config), "--out", str(out), check=False, timeout_s=120)
        _, first_err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"error: --out {out} is in use by another sweep or run that is still going; wait for it to end (a sweep "
        "into it then resumes it) or choose another folder"]
    assert first.returncode == 0, first_err[-2000:]
    index = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done", "done"]
    for point in index["points"]:  # each point's run says what sweep.json says
        assert json.loads((out / point["dir"] / "run.json").read_text())["status"] == "done"
    resumed = run_cli("sweep", str(config), "--out", str(out), timeout_s=600)  # the first ended: allowed
    assert "2 of 2 points done" in resumed.stdout
    assert [p["status"] for p in json.loads((out / "sweep.json").read_text())["points"]] == ["skipped", "skipped"]
