"""A job's progress as Events: the library's jobs (a sweep, a capacity search, tune's live runs) report
through a view with four calls (note, start, ticker, finished: the shape of the terminal's SweepView);
CallbackView is that view for any callback, so the same job code serves the command line's live display,
a log, a notebook's widget, or nothing (CallbackView(None)). batchlab.api hands them on (api.progress)."""
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchlab.lab.sweep_plan import Point


class EventKind(str, Enum):
    """What an Event says (a str: `event.kind == "tick"` holds too)."""

    START = "start"  # a job's `total` points (a lone run: 1, and its `folder`) are known
    NOTE = "note"  # a line of `text`
    TICK = "tick"  # a run is going: `elapsed_s` since its launch, `alive` each role's process (about 5 a second)
    FINISHED = "finished"  # a point ended: `record` is its sweep.json entry, `text` one line about it
    STUDY = "study"  # the whole study: its `phase`, `done` of `total` live runs, `left_s` estimated; `text` one line


@dataclass(frozen=True, slots=True)
class Event:
    """One step of a job's progress (EventKind says which; the fields it does not use keep their defaults)."""

    kind: EventKind
    text: str = ""
    total: int = 0
    point: "Point | None" = None  # the sweep point a tick or finish is about; None for a lone run
    phase: str = ""  # what a tick's run is for: "run", "repeat", or a capacity search's "saturated", "probe"
    elapsed_s: float = 0.0
    alive: dict[str, bool] = field(default_factory=dict)  # role name → its process is alive
    record: dict = field(default_factory=dict)
    folder: Path | None = None  # the run's folder (a tick's: its progress.json, its part files)
    done: int = 0  # a study event's live runs done ...
    left_s: float | None = None  # ... and the time left at the pace so far (None: not yet known)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EventKind(self.kind))  # "tick" as given is EventKind.TICK


class CallbackView:
    """The view the library's jobs call (note, start, ticker, finished), as Events to `on_progress`."""

    def __init__(self, on_progress: Callable[[Event], None] | None) -> None:
        self.emit = on_progress or (lambda _event: None)

    def note(self, line: str) -> None:
        """A line about the job."""
        self.emit(Event(EventKind.NOTE, text=line))

    def start(self, n_points: int) -> None:
        """The sweep's points are known."""
        self.emit(Event(EventKind.START, total=n_points))

    def started(self, n_points: int, folder: Path) -> None:
        """A job into `folder` (a lone run's own) starts with its points known."""
        self.emit(Event(EventKind.START, total=n_points, folder=folder))

    def ticker(self, point, what: str):
        """An on_tick callback (launch_run) for a run of sweep point `point`, doing `what`."""
        folder = point.folder if point is not None else None
        return lambda elapsed_s, alive: self.emit(Event(EventKind.TICK, point=point, phase=what, elapsed_s=elapsed_s,
                                                        alive=dict(alive), folder=folder))

    def study(self, phase: str, done: int, total: int, left_s: float | None, text: str) -> None:
        """The whole study's progress (StudyProgress)."""
        self.emit(Event(EventKind.STUDY, text=text, total=total, phase=phase, done=done, left_s=left_s))

    def finished(self, point, record: dict) -> None:
        """A point ended (done, skipped or failed)."""
        from batchlab.lab.sweep_point import finished_line

        self.emit(Event(EventKind.FINISHED, text=finished_line(point, record), point=point, record=record))


class StudyProgress:
    """A whole study's progress, one line: its phase, the live runs done of those planned, and the time left at
    the pace so far (each planned run's traffic plus the median start-up, drain and writing of the runs done).
    Phases are planned as they become known (`plan`); a run ends with `ran`; the view's `study` gets each
    update (a view without one gets nothing)."""

    def __init__(self, view) -> None:
        import time

        self.view, self.started = view, time.monotonic()
        self.planned: dict[str, list[float]] = {}  # phase → each planned run's traffic, s (runs not yet done)
        self.done: dict[str, int] = {}
        self.overheads: list[float] = []  # wall − traffic of each run done
        self.phase = ""

    def plan(self, phase: str, traffic_s: list[float]) -> None:
        """The runs `phase` will make (their traffic, s), replacing what was planned for it."""
        self.planned[phase] = list(traffic_s)
        self.done.setdefault(phase, 0)

    def ran(self, phase: str, wall_s: float, traffic_s: float) -> None:
        """A run of `phase` ended after wall_s, with traffic_s of traffic."""
        self.phase = phase
        self.done[phase] = self.done.get(phase, 0) + 1
        left = self.planned.get(phase, [])
        if left:
            left.pop(0)
        self.overheads.append(max(wall_s - traffic_s, 0.0))
        self.emit()

    def left_s(self) -> float | None:
        """Seconds left at the pace so far (None before a run ended)."""
        if not self.overheads:
            return None
        import statistics

        overhead = statistics.median(self.overheads)
        return sum(t + overhead for runs in self.planned.values() for t in runs)

    def emit(self) -> None:
        import time

        done, total = sum(self.done.values()), sum(self.done.values()) + sum(map(len, self.planned.values()))
        left = self.left_s()
        elapsed = time.monotonic() - self.started
        text = (f"study: {self.phase}, {done} of {total} live runs, {_clock(elapsed)} so far"
                + (f", about {_clock(left)} left" if left is not None else ""))
        study = getattr(self.view, "study", None)
        if study is not None:
            study(self.phase, done, total, left, text)


def _clock(seconds: float) -> str:
    """'4 min 05 s' or '37 s'."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"
