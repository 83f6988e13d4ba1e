"""The sweep's live display: points done / left, and the running point's rate, queue, batch and
throughput, read from the part files its collector writes every second (OUT/.parts/*.parquet)."""
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from batchlab.protocol.run_dir import RunDir

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
    """A rich progress bar and status line on a terminal; one plain line per point otherwise."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console)
        self.status = Text("")
        self.live = Live(Group(self.progress, self.status), console=self.console, refresh_per_second=4,
                         transient=True) if self.console.is_terminal else None
        self.task = None
        self.counts = {"done": 0, "skipped": 0, "failed": 0}
        self._ticking: tuple = (None, None, None)  # (point, phase, its ticker) of the run now ticking

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
        folder = point.folder if point is not None else None
        peek, last = (PartsPeek(folder) if folder else None), [0.0]

        def tick(elapsed_s: float, _alive: dict) -> None:
            if self.live is None or time.monotonic() - last[0] < PEEK_INTERVAL_S:
                return
            last[0] = time.monotonic()
            self.status.plain = self._line(point, what, elapsed_s, peek.update() if peek else None)

        return tick

    def _line(self, point, what: str, elapsed_s: float, peek: PartsPeek | None) -> str:
        head = f"{what} {point.entry.label} {_load(point)} rep {point.repeat}" if point else what
        counts = " ".join(f"{k} {v}" for k, v in self.counts.items())
        if peek is None:
            return f"{head}  {elapsed_s:5.1f}s"
        return (f"{head}  {elapsed_s:5.1f}s  queue {peek.queue_len}  batch {peek.batch_size}  "
                f"{peek.throughput_tok_s():7.1f} tok/s  |  {counts}")

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

    def __call__(self, event) -> None:
        """The view as a progress callback of batchlab.api (an api.progress.Event): the command line's
        display of the same jobs a library caller runs."""
        if event.kind == "start":
            self.start(event.total)
        elif event.kind == "note":
            self.note(event.text)
        elif event.kind == "finished":
            self.finished(event.point, event.record)
        elif event.kind == "tick":
            if self._ticking[:2] != (event.point, event.phase):  # a new run: its own part files to peek at
                self._ticking = (event.point, event.phase, self.ticker(event.point, event.phase))
            self._ticking[2](event.elapsed_s, event.alive)


def finished_line(point, record: dict) -> str:
    """'dynamic λ=5 rep 0: done in 12.3s' (a failed point: its reason's first line)."""
    status = record["status"]
    took = f" in {record['elapsed_s']:.1f}s" if status != "skipped" and record.get("elapsed_s") else ""
    reason = f": {record['reason'].splitlines()[0]}" if status == "failed" and record.get("reason") else ""
    return f"{point.entry.label} {_load(point, '')} rep {point.repeat}: {status}{took}{reason}"


def _load(point, unit: str = " req/s") -> str:
    """A sweep point's load: 'λ=5 req/s', or closed loop '4 clients'."""
    concurrency = getattr(point, "concurrency", 0)
    return f"{concurrency} clients" if concurrency else f"λ={point.rate:g}{unit}"
