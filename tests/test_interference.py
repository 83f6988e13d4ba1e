"""The rest of the machine's CPU beside a run: the pure figures from samples (stats.interference), the
meter's accounting of a process tree against the whole machine (runner.cpu_meter), and the worker's thread
plans (worker.threads)."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from batchlab.runner.cpu_meter import CpuMeter
from batchlab.stats.interference import (BURST_CORES, DISTURBED_CORES, CpuSample, Interference, interference,
                                         is_burst, read)
from batchlab.worker import threads


def test_other_work_is_the_machines_busy_time_less_the_runs_own():
    # 2 cores; each second the machine was busy 1.5 s, the run 0.5 s of it: 1 core of other work
    samples = [CpuSample(t, 1.5 * t, 0.0, 0.5 * t) for t in range(11)]
    found = interference(samples, cores=2)
    assert found.window_s == 10 and found.other_cores == pytest.approx(1.0) and found.own_cores == pytest.approx(0.5)
    assert found.disturbed and "1.00 of 2 cores" in found.text()


def test_the_peak_is_the_busiest_interval_and_the_window_cuts_the_samples():
    busy = [0, 0.1, 0.2, 1.2, 1.3, 1.4]  # one second at a full core of other work, the rest at 0.1
    samples = [CpuSample(float(t), b, 0.0, 0.0) for t, b in enumerate(busy)]
    found = interference(samples, cores=4)
    assert found.other_peak_cores == pytest.approx(1.0) and found.other_cores == pytest.approx(1.4 / 5)
    assert interference(samples, cores=4, start_s=3).other_cores == pytest.approx(0.1)
    assert interference(samples, cores=4, start_s=5) is None  # one sample: no interval


def test_steal_alone_disturbs_a_run_and_a_quiet_one_is_not_disturbed():
    quiet = interference([CpuSample(0, 0, 0, 0), CpuSample(10, 1.0, 0.0, 0.5)], cores=2)
    assert quiet.other_cores == pytest.approx(0.05) and not quiet.disturbed
    stolen = interference([CpuSample(0, 0, 0, 0), CpuSample(10, 0.5, 2.0, 0.5)], cores=2)
    assert stolen.steal_share == pytest.approx(0.1) and stolen.disturbed


def test_a_burst_is_disturbance_above_the_sweeps_usual_not_a_neighbour_that_stays():
    def of(cores: float) -> Interference:
        return Interference(2, 10, cores, cores, 1.0, 0.0, 20)

    assert not is_burst(of(DISTURBED_CORES / 2), None)  # quiet
    assert is_burst(of(1.0), None) and is_burst(of(1.0), 0.1)  # nothing usual yet; or usually quiet
    assert not is_burst(of(1.0), 0.95)  # a neighbour beside every run: reported, not chased
    assert is_burst(of(0.95 + BURST_CORES + 0.1), 0.95)


def test_the_summary_entry_reads_back_and_anything_else_is_none():
    found = interference([CpuSample(0, 0, 0, 0), CpuSample(2, 3, 0, 1)], cores=2)
    assert read(found.as_dict()) == found and found.as_dict()["disturbed"]
    assert read(None) is None and read({"cores": 2}) is None and read("busy") is None


def _outside_hog() -> psutil.Process:
    """A CPU-bound process that is not this process's descendant (its parent shell exits at once)."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    return psutil.Process(int(out))


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def test_the_meter_counts_a_child_as_the_runs_own_and_a_stranger_as_other_work():
    """Accounting, not timing: whatever else the machine does, the hog's own CPU time lands on the side
    it belongs to (own when it is in the metered tree, other when not)."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before, meter = _cpu_s(psutil.Process(child.pid)), CpuMeter().start()
        time.sleep(2.0)
        found, used = meter.stop(), _cpu_s(psutil.Process(child.pid))
        hog_cores = (used - before) / found.window_s
        assert hog_cores > 0.05  # it ran at all (a machine loaded beyond reason fails here, not below)
        assert found.own_cores == pytest.approx(hog_cores, abs=0.1 + 0.2 * hog_cores)
    finally:
        child.kill()
        child.wait()
    stranger = _outside_hog()
    try:
        assert stranger.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        time.sleep(0.3)
        before, meter = _cpu_s(stranger), CpuMeter().start()
        time.sleep(2.0)
        found, used = meter.stop(), _cpu_s(stranger)
        hog_cores = (used - before) / found.window_s
        assert found.own_cores < 0.1  # this test process sleeps
        assert found.other_cores >= hog_cores - 0.1  # the stranger's CPU (and whatever else ran) is other work
    finally:
        stranger.kill()


def test_each_thread_policy_means_threads_a_wait_and_cpus():
    cpus = [0, 1, 2, 3]
    assert (threads.plan("spare", cpus).threads, threads.plan("spare", cpus).wait) == (3, "passive")
    assert threads.plan("auto", cpus) == threads.ThreadPlan("auto", 3, "passive", [], [])
    assert threads.plan("torch", cpus).threads == 0 and threads.plan("torch", cpus).wait == ""
    assert threads.plan("all", cpus).threads == 4 and threads.plan("one", cpus).threads == 1
    assert threads.plan("6", cpus).threads == 6
    pinned = threads.plan("pinned", cpus)
    assert (pinned.threads, pinned.worker_cpus, pinned.harness_cpus) == (3, [0, 1, 2], [3])
    assert threads.plan("spare", [5]).threads == 1 and threads.plan("pinned", [5]).worker_cpus == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_worker_process_gets_its_plan_before_torch_starts():
    """In a fresh process, as a worker's: threads and OpenMP's wait from the plan, torch obeying them."""
    code = ("import os\nfrom batchlab.protocol.settings import RunConfig\nfrom batchlab.worker.threads import "
            "place_worker\np = place_worker(RunConfig(backend='hf', cpu_threads='one'))\nimport torch\n"
            "print(torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'], p.facts()['thread_policy'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["1", "PASSIVE", "one"], out.stderr


def test_a_bad_thread_policy_is_one_line_naming_the_choices():
    from batchlab.protocol.settings import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=r"--cpu-threads must be one of auto, torch, all, spare, one, pinned"):
        RunConfig(cpu_threads="lots")
    assert RunConfig(cpu_threads=" Spare ").cpu_threads == "spare" and RunConfig(cpu_threads=3).cpu_threads == "3"


def test_a_thread_policy_given_to_a_backend_without_threads_is_refused():
    from batchlab.protocol.settings import ConfigError, RunConfig, refuse_ignored

    with pytest.raises(ConfigError, match=r"backend sim ignores cpu_threads \(the hf and vllm backend's\)"):
        refuse_ignored(RunConfig(backend="sim", cpu_threads="one"))
    refuse_ignored(RunConfig(backend="hf", cpu_threads="one"))
    refuse_ignored(RunConfig(strategy="vllm", cpu_threads="2"))
    refuse_ignored(RunConfig(backend="sim"))  # the default, not given: nothing to refuse
