"""A run's progress while it goes: phase, elapsed against the planned traffic time, and the request
counts (finished / in flight / queued / failed, from the collector's progress.json). On a terminal a
live line (rich); otherwise a plain line every LOG_INTERVAL_S, so a log shows the run is alive."""
import json
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from batchlab.runner.launcher import launch_run
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig

LOG_INTERVAL_S = 5.0  # output not a terminal: one progress line this often
READ_INTERVAL_S = 1.0  # progress.json is read at most this often


class Progress:
    """The status text of one run, from the launcher's ticks and the collector's counts."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.path = cfg, RunDir(cfg.out).progress
        self.counts: dict = {}
        self.read_at = float("-inf")
        self.sending_since: float | None = None  # launcher clock when the first request arrived

    def tick(self, t: float) -> None:
        """Read the collector's counts (at most every READ_INTERVAL_S) and note when sending began."""
        if t - self.read_at < READ_INTERVAL_S:
            return
        self.read_at = t
        try:
            self.counts = json.loads(self.path.read_text())
        except (OSError, ValueError):
            pass
        self.phase(t)

    def phase(self, elapsed_s: float) -> str:
        """starting (no request yet), sending (within the planned traffic time) or draining."""
        if not self.counts.get("arrived"):
            return "starting"
        if self.sending_since is None:
            self.sending_since = elapsed_s
        if self.cfg.num_requests and self.counts.get("arrived", 0) >= self.cfg.num_requests:
            return "draining"  # the count stop came first
        return "sending" if elapsed_s - self.sending_since < self.cfg.duration_s else "draining"

    def text(self, elapsed_s: float, alive: dict[str, bool]) -> str:
        """'dynamic/sim λ=20 req/s  sending 3.1 s of 10 s  finished 40 · in flight 8 · queued 3 · failed 0'."""
        self.tick(elapsed_s)
        c, phase = self.counts, self.phase(elapsed_s)
        since = elapsed_s - self.sending_since if self.sending_since is not None else 0.0
        dead = [n for n, a in alive.items() if not a]
        load = f"{self.cfg.concurrency} clients" if self.cfg.concurrency else f"λ={self.cfg.rate:g} req/s"
        stop = (f"sent {c.get('arrived', 0)} of {self.cfg.num_requests}" if self.cfg.num_requests
                else f"of {self.cfg.duration_s:g} s")  # a count stop: the duration is only its bound
        return (f"{self.cfg.strategy}/{self.cfg.backend} {load}  {phase} "
                f"{since:5.1f} s {stop}  finished {c.get('finished', 0)} · in flight "
                f"{c.get('in_flight', 0)} · queued {c.get('queued', 0)} · failed {c.get('failed', 0)}"
                + (f"  (ended: {', '.join(dead)})" if dead else ""))


def run_with_status(cfg: RunConfig) -> dict:
    """launch_run with its progress: a live line on a terminal, else a logged line every few seconds."""
    console, progress = Console(stderr=True), Progress(cfg)
    if not console.is_terminal:
        last = [float("-inf")]

        def log_tick(elapsed_s: float, alive: dict[str, bool]) -> None:
            progress.tick(elapsed_s)
            if elapsed_s - last[0] >= LOG_INTERVAL_S:
                last[0] = elapsed_s
                console.print(f"{time.strftime('%H:%M:%S')} {progress.text(elapsed_s, alive)}", soft_wrap=True)

        return launch_run(cfg, on_tick=log_tick)
    with Live(Text(""), console=console, refresh_per_second=4, transient=True) as live:
        return launch_run(cfg, on_tick=lambda e, alive: live.update(Text(progress.text(e, alive))))
