"""A run's progress while it goes: phase, elapsed against the planned traffic time, and the request
counts (finished / in flight / queued / failed, from the collector's progress.json). On a terminal a
live line (rich); otherwise a plain line every LOG_INTERVAL_S, so a log shows the run is alive."""
import json
import time

from rich.console import Console
from rich.live import Live
from rich.text import Text

from batchlab.cli.launcher import launch_run
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


class RunStatus:
    """A run's progress on stderr, as a progress callback (batchlab.api.Event ticks): a live line on a
    terminal (while this is entered as a context), else a plain line every LOG_INTERVAL_S."""

    def __init__(self, cfg: RunConfig) -> None:
        self.console, self.progress = Console(stderr=True), Progress(cfg)
        self.live: Live | None = None
        self.logged_at = float("-inf")

    def __enter__(self) -> "RunStatus":
        if self.console.is_terminal:
            self.live = Live(Text(""), console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def __call__(self, event) -> None:
        """Show a tick (other events are not a lone run's)."""
        if event.kind == "tick":
            self.tick(event.elapsed_s, event.alive)

    def tick(self, elapsed_s: float, alive: dict[str, bool]) -> None:
        """launch_run's on_tick: refresh the live line, or log one now and then."""
        if self.live is not None:
            self.live.update(Text(self.progress.text(elapsed_s, alive)))
            return
        self.progress.tick(elapsed_s)
        if elapsed_s - self.logged_at >= LOG_INTERVAL_S:
            self.logged_at = elapsed_s
            self.console.print(f"{time.strftime('%H:%M:%S')} {self.progress.text(elapsed_s, alive)}", soft_wrap=True)


def run_with_status(cfg: RunConfig) -> dict:
    """launch_run with its progress: a live line on a terminal, else a logged line every few seconds."""
    with RunStatus(cfg) as status:
        return launch_run(cfg, on_tick=status.tick)
