"""Every process a run or a sweep starts, and every process those start, is gone when it ends: on
success, on a time limit, and on Ctrl-C (the real vLLM engine included; a sim run's Ctrl-C at every moment is
tests/test_fault_matrix.py's).

Each command runs with a unique marker in its environment; every descendant inherits it, even one
re-parented to init after its parent died, so a scan of all processes for the marker finds leftovers
that a walk of the process tree would miss.
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil
import pytest

from batchlab.collector.layout import point_dir

from tests.conftest import ROOT, default_sigint

pytestmark = pytest.mark.slow
MARKER = "BATCHLAB_TEST_MARKER"
SIM = ["--backend", "sim", "--preset", "cpu-tiny-mistral", "--dataset", "synthetic", "--max-new-tokens", "16",
       "--max-prompt-len", "64"]


def marked(marker: str) -> list[psutil.Process]:
    """Live processes (zombies excepted) whose environment holds the marker."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == marker:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def start(args: list[str], marker: str) -> subprocess.Popen:
    """`batchlab ARGS` in a session of its own, as a terminal would start it; output to /dev/null."""
    return subprocess.Popen([sys.executable, "-m", "batchlab.cli.main", *args], cwd=ROOT,
                            env={**os.environ, MARKER: marker}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=default_sigint)


def start_sweep(tmp_path: Path, base: str, grid: str, marker: str) -> subprocess.Popen:
    """`batchlab sweep` of sim points (synthetic prompts ≤ 64 tokens) into tmp_path/out."""
    config = tmp_path / "sweep.yaml"
    config.write_text("base: {backend: sim, preset: cpu-tiny-mistral, dataset: synthetic, max_prompt_len: 64, "
                      f"{base}}}\ngrid: {{{grid}}}\n")
    return start(["sweep", str(config), "--out", str(tmp_path / "out")], marker)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def assert_nothing_left(marker: str, proc: subprocess.Popen) -> None:
    """The command ended and no process carrying its marker is alive (a short grace for exits)."""
    assert proc.poll() is not None
    deadline = time.monotonic() + 10
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.name(), " ".join(p.cmdline())[:120]) for p in marked(marker)]
    for p in marked(marker):  # do not leak into the next tests either
        p.kill()
    assert not left, f"processes left behind: {left}"


def ctrl_c(proc: subprocess.Popen) -> None:
    """SIGINT to the command's whole process group: what the terminal does on Ctrl-C."""
    os.killpg(proc.pid, signal.SIGINT)


def cut_short(requests: pd.DataFrame) -> bool:
    """The interrupt really stopped the run: some of its requests were never sent."""
    return bool(requests.error.fillna("").str.startswith("not sent").any())


def run_started(out: Path) -> bool:
    """The launcher writes timing.json when the traffic got its Start (the first request is due)."""
    return (out / "timing.json").exists()


def test_a_finished_run_leaves_no_process(tmp_path):
    marker = uuid.uuid4().hex
    proc = start(["run", *SIM, "--strategy", "dynamic", "--rate", "10", "--duration", "1", "--out",
                  str(tmp_path)], marker)
    assert proc.wait(timeout=120) == 0
    assert_nothing_left(marker, proc)


def test_a_sweep_stopped_by_ctrl_c_leaves_no_warm_worker(tmp_path):
    marker = uuid.uuid4().hex  # interleaved: at rate 6 the static and the continuous pools are both warm
    proc = start_sweep(tmp_path, "duration_s: 2, max_new_tokens: 16",
                       "strategies: [naive, continuous], rates: [5, 6], order: interleaved", marker)
    wait_until(lambda: run_started(tmp_path / "out" / point_dir("naive", 6, 0)), 180, "the third point")
    assert len(marked(marker)) >= 6  # the sweep, two warm workers, the run's collector, scheduler and traffic
    ctrl_c(proc)
    proc.wait(timeout=120)
    assert_nothing_left(marker, proc)
    assert (tmp_path / "out" / point_dir("continuous", 5, 0) / "point.json").exists()
    assert proc.returncode != 0 and not (tmp_path / "out" / point_dir("continuous", 6, 0) / "point.json").exists()


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_points_sharing_worker_settings_run_on_one_warm_worker(tmp_path, order):
    marker = uuid.uuid4().hex
    proc = start_sweep(tmp_path, "duration_s: 1, max_new_tokens: 8, batch_size: 4, max_batch_size: 4",
                       f"strategies: [naive, dynamic, continuous], rates: [4, 8], order: {order}", marker)
    assert proc.wait(timeout=300) == 0
    assert_nothing_left(marker, proc)
    index = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert index["order"] == order
    order_run = [(p["label"], p["rate"]) for p in index["points"]]
    warm, pids = [], {}
    for label, rate in order_run:
        folder = tmp_path / "out" / point_dir(label, rate, 0)
        summary = json.loads((folder / "summary.json").read_text())
        warm.append(summary["settings"]["workers"]["worker-0"]["warm_runs_before"])
        pids[(label, rate)] = json.loads((folder / "pids.json").read_text())["worker-0"]
        assert summary["failed"] == 0 and summary["finished"] > 0
        assert (folder / "point.json").exists() and "startup_s" in json.loads((folder / "point.json").read_text())
    static = [k for k in order_run if k[0] != "continuous"]
    continuous = [k for k in order_run if k[0] == "continuous"]
    if order == "grouped":  # one group after the other, the plan's order inside each
        assert order_run == static + continuous and warm == [0, 1, 2, 3, 0, 1]
    else:  # the plan's order, both groups' workers warm throughout
        assert order_run == [("naive", 4), ("dynamic", 4), ("continuous", 4), ("naive", 8), ("dynamic", 8),
                             ("continuous", 8)]
        assert warm == [0, 1, 0, 2, 3, 1]
    assert len({pids[k] for k in static}) == 1 and len({pids[k] for k in continuous}) == 1
    assert pids[static[0]] != pids[continuous[0]]


def test_the_run_limit_counts_from_the_first_request_and_startup_has_its_own(tmp_path):
    from batchlab.protocol.settings import build_config
    from batchlab.runner.launcher import Limits, RunTimeout, launch_run

    cfg = build_config({"backend": "sim", "preset": "cpu-tiny-mistral", "dataset": "synthetic", "rate": 20,
                        "duration_s": 20, "max_new_tokens": 16, "max_prompt_len": 64,
                        "out": str(tmp_path / "run")}, {})
    t = time.monotonic()
    with pytest.raises(RunTimeout) as stopped:
        launch_run(cfg, limits=Limits(startup_s=600, run_s=2.0))
    assert stopped.value.phase == "run" and time.monotonic() - t < 60
    startup_s = json.loads((tmp_path / "run" / "timing.json").read_text())["startup_s"]
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert startup_s > 0 and (requests.status == "finished").any() and (requests.status == "failed").any()
    sent = requests[requests.error.fillna("").str.startswith("not sent") == False]  # noqa: E712
    # the traffic ran its 2 s (at 20 req/s, requests planned after 1.5 s went out) and was then stopped,
    # far before its 20 s: the limit counted from the first request, not from launch
    assert 1.5 <= sent.arrival_time.max() < 10.0

    cfg = build_config({**cfg.as_settings(), "out": str(tmp_path / "slow-start")}, {})
    with pytest.raises(RunTimeout) as never_ready:
        launch_run(cfg, limits=Limits(startup_s=0.05, run_s=600))  # spawning alone takes longer
    assert never_ready.value.phase == "startup" and "start-up" in str(never_ready.value)
    assert not (tmp_path / "slow-start" / "timing.json").exists()


@pytest.mark.vllm
def test_ctrl_c_mid_run_on_the_real_vllm_engine_leaves_no_process(tmp_path):
    pytest.importorskip("vllm")
    marker = uuid.uuid4().hex
    proc = start(["run", "--strategy", "vllm", "--model", "tiny-mistral", "--memory-budget", "1GiB",
                  "--max-num-seqs", "8", "--enforce-eager", "--rate", "4", "--duration", "60",
                  "--max-new-tokens", "16", "--max-prompt-len", "128", "--out", str(tmp_path)], marker)
    wait_until(lambda: run_started(tmp_path), 600, "the vLLM engine to start and the first request")
    wait_until(lambda: any(tmp_path.glob(".parts/requests-*")), 300, "a finished request")  # mid-run
    assert len(marked(marker)) >= 5
    ctrl_c(proc)
    proc.wait(timeout=180)
    assert_nothing_left(marker, proc)
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert (requests.status == "finished").any() and proc.returncode != 0 and cut_short(requests)
