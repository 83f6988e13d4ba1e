"""A meter of the machine's CPU beside a run: a thread that samples, every INTERVAL_S, the whole machine's busy
and steal CPU time (psutil.cpu_times) and the CPU time of a process tree (the launcher and every process it
started: roles, warm workers, an engine's own processes). stats.interference turns the samples into the
rest of the machine's share."""
import os
import threading
import time

import psutil

from batchlab.stats.interference import CpuSample, Interference, interference

INTERVAL_S = 0.5


def machine_busy_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot (guest time is inside user on Linux)."""
    t = psutil.cpu_times()
    busy = t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    return busy, getattr(t, "steal", 0.0)


class CpuMeter:
    """Samples the machine's CPU and a process tree's (root: a pid, default this process) until stop()."""

    def __init__(self, root_pid: int | None = None, interval_s: float = INTERVAL_S) -> None:
        self.root = psutil.Process(root_pid or os.getpid())
        self.interval_s = interval_s
        self.samples: list[CpuSample] = []
        self._seen: dict[tuple[int, float], float] = {}  # (pid, create time) → its last CPU s: the dead keep it
        self._base: dict[tuple[int, float], float] = {}  # the tree's CPU at start, per process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)

    def _tree_cpu_s(self) -> float:
        """The tree's CPU seconds since start: every member's user + system beyond its start, a member that
        exited since counted with its last reading."""
        try:
            members = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            members = []
        for proc in members:
            try:
                with proc.oneshot():
                    key, t = (proc.pid, proc.create_time()), proc.cpu_times()
                self._seen[key] = t.user + t.system
            except psutil.Error:  # it ended between the listing and the reading
                continue
        return sum(v - self._base.get(k, 0.0) for k, v in self._seen.items())

    def sample(self) -> CpuSample:
        """One reading, kept."""
        busy, steal = machine_busy_s()
        s = CpuSample(time.monotonic(), busy, steal, self._tree_cpu_s())
        self.samples.append(s)
        return s

    def start(self) -> "CpuMeter":
        """The first reading now (the tree's CPU so far is the baseline), then one every interval."""
        self._tree_cpu_s()
        self._base = dict(self._seen)
        self.sample()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self, start_s: float | None = None, end_s: float | None = None) -> Interference | None:
        """Stop sampling (a last reading now); the figures over [start_s, end_s] (monotonic s; default all)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()
        lo = start_s if start_s is not None else self.samples[0].t
        hi = end_s if end_s is not None else self.samples[-1].t
        return interference(self.samples, psutil.cpu_count() or 1, lo, hi)
