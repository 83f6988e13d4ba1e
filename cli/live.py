"""A run's progress while it goes: phase, elapsed against the planned traffic time, and the request
counts (finished / in flight / queued / failed, from the collector's progress.json). On a terminal a
live line (rich); otherwise a plain line every LOG_INTERVAL_S, so a log shows the run is alive.

And a sweep's (SweepView): points done / left, and the running point's rate, queue, batch and throughput,
read from the part files its collector writes every second (OUT/.parts/*.parquet)."""
import contextlib
import json
import sys
import time
from pathlib import Path

import pandas as pd
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as Bars  # Progress here is the run's
from rich.text import Text

from batchlab.protocol.outcomes import RunOutcome
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig
from batchlab.lab.sweep_point import finished_line, load_text

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
        with contextlib.suppress(OSError, ValueError):
            self.counts = json.loads(self.path.read_text())
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
        stop = (f"sent {c.get('arrived', 0)} of {self.cfg.num_requests}" if self.cfg.num_requests
                else f"of {self.cfg.duration_s:g} s")  # a count stop: the duration is only its bound
        return (f"{self.cfg.strategy}/{self.cfg.backend} {load_text(self.cfg)}  {phase} "
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
        self.folder: Path | None = None  # the run's folder, once its start or a tick names it

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
        """Note the run's folder (its start names it); show a tick (other events are not a lone run's)."""
        if event.folder is not None and event.folder != self.folder:
            self.folder, self.progress.path = event.folder, RunDir(event.folder).progress
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


class RunsStatus(contextlib.ExitStack):
    """Runs one after another (tune's live confirmations) as a progress callback: a note (the next run
    starts) ends the last run's RunStatus and is printed on stdout, then ticks show the new run's.
    `cfg`: the runs' settings, their folders aside (each tick names its run's)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg, self.status = cfg, None

    def __call__(self, event) -> None:
        """Print a note; show a tick (in its run's RunStatus, started at the run's first tick)."""
        if event.kind == "note":
            self.close()
            self.status = None
            typer.echo(event.text)
        elif event.kind == "tick":
            if self.status is None:
                self.status = self.enter_context(RunStatus(self.cfg.model_copy(update={"out": str(event.folder)})))
            self.status(event)


PEEK_INTERVAL_S = 1.0  # the collector flushes parts once a second; reading faster gains nothing


class PartsPeek:
    """Running totals over a run's part files, each read once."""

    def __init__(self, out_dir: Path) -> None:
        self.parts_dir = RunDir(out_dir).parts_dir
        self.seen: set[str] = set()
        self.tokens = 0
        self.last_token_s = 0.0  # s since t0 of the newest finished token seen
        self.queue_len = 0
        self.batch_size = 0

    def update(self) -> "PartsPeek":
        """Read the part files that appeared since the last call (a vanished file is skipped)."""
        for path in sorted(self.parts_dir.glob("*.parquet")):
            if path.name not in self.seen:
                self.seen.add(path.name)
                try:
                    self._read(path.name.split("-")[0], pd.read_parquet(path))
                except (OSError, ValueError):
                    continue
        return self

    def _read(self, table: str, df: pd.DataFrame) -> None:
        if df.empty:
            return
        if table == "tokens":
            self.tokens += len(df)
            self.last_token_s = max(self.last_token_s, float(df["time"].max()))
        elif table == "batches":
            self.batch_size, self.queue_len = int(df["size"].iloc[-1]), int(df["queue_len"].iloc[-1])
        elif table == "steps":
            self.batch_size = int(df["running"].iloc[-1])

    def throughput_tok_s(self) -> float:
        """Output tokens of finished requests per second so far."""
        return self.tokens / self.last_token_s if self.last_token_s > 0 else 0.0


class SweepView:
    """A rich progress bar and status line on a terminal; one plain line per point otherwise. `figures`: a
    done point's measured figures under its line, as `run` shows them at its end."""

    def __init__(self, figures: bool = False) -> None:
        self.console, self.figures = Console(stderr=True), figures
        self.progress = Bars(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=self.console)
        self.status, self.study = Text(""), Text("")
        self.live = Live(Group(self.study, self.progress, self.status), console=self.console, refresh_per_second=4,
                         transient=True) if self.console.is_terminal else None
        self.task = None
        self.counts = {RunOutcome.DONE: 0, RunOutcome.SKIPPED: 0, RunOutcome.FAILED: 0}
        self._ticking: tuple = (None, None, None)  # (point, phase, its ticker) of the run ticking now

    def __enter__(self) -> "SweepView":
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def start(self, n_points: int) -> None:
        """The grid is known: n_points to go."""
        self.task = self.progress.add_task("sweep", total=n_points)

    def ticker(self, point, what: str):
        """An on_tick callback for launch_run that refreshes the status line about once a second."""
        peek, last = (PartsPeek(point.folder) if point is not None else None), [0.0]

        def tick(elapsed_s: float, _alive: dict) -> None:
            if self.live is None or time.monotonic() - last[0] < PEEK_INTERVAL_S:
                return
            last[0] = time.monotonic()
            self.status.plain = self._line(point, what, elapsed_s, peek.update() if peek else None)

        return tick

    def _line(self, point, what: str, elapsed_s: float, peek: PartsPeek | None) -> str:
        head = f"{what} {point.entry.label} {load_text(point)} rep {point.repeat}" if point else what
        counts = " ".join(f"{k} {v}" for k, v in self.counts.items())
        if peek is None:
            return f"{head}  {elapsed_s:5.1f}s"
        return (f"{head}  {elapsed_s:5.1f}s  queue {peek.queue_len}  batch {peek.batch_size}  "
                f"{peek.throughput_tok_s():7.1f} tok/s  |  {counts}")

    def study_line(self, line: str) -> None:
        """The whole study's progress: the line above the status line on a terminal, a plain line otherwise."""
        if self.live is not None:
            self.study.plain = line
        else:
            print(line, file=sys.stderr, flush=True)

    def note(self, line: str) -> None:
        """A log line above the bar (a plain stderr line off a terminal)."""
        if self.live is not None:
            self.console.print(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def finished(self, point, record: dict) -> None:
        """One point ended (done, skipped or failed): a log line and the bar moves."""
        status = record["status"]
        self.counts[status] = self.counts.get(status, 0) + 1
        self.note(finished_line(point, record))
        if self.task is not None:
            self.progress.advance(self.task)
        if self.figures and status == RunOutcome.DONE:
            self._show_figures(point)

    def __call__(self, event) -> None:
        """The view as a progress callback of batchlab.api (an api.progress.Event): the command line's
        display of the same jobs a library caller runs."""
        if event.kind == "start":
            self.start(event.total)
        elif event.kind == "note":
            self.note(event.text)
        elif event.kind == "finished":
            self.finished(event.point, event.record)
        elif event.kind == "study":
            self.study_line(event.text)
        elif event.kind == "tick":
            if self._ticking[:2] != (event.point, event.phase):  # a new run: its own part files to peek at
                self._ticking = (event.point, event.phase, self.ticker(event.point, event.phase))
            self._ticking[2](event.elapsed_s, event.alive)

    def _show_figures(self, point) -> None:
        """Nothing when the point's summary cannot be read: the report names that point's fault."""
        from batchlab.cli.result_table import point_line
        from batchlab.collector.summary import SummaryError, read_summary

        with contextlib.suppress(OSError, ValueError, SummaryError):
            self.note(f"  {point_line(read_summary(point.folder))}")
