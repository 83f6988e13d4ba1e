"""Progress as the API reports it: one Event at a time to a callback the caller chooses (None: silent);
the Event and the view the library's jobs call are lab.progress's."""
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from batchlab.lab.progress import CallbackView, Event, EventKind  # noqa: F401  (CallbackView: the API's jobs use it)

log = logging.getLogger("batchlab")
OnProgress = Callable[[Event], None]


def log_progress(event: Event) -> None:
    """A ready callback: every note, start, finished point and study progress line as a line on the `batchlab`
    logger (INFO); ticks are left out."""
    if event.kind == EventKind.START:
        log.info("%s", _start_line(event))
    elif event.kind in (EventKind.NOTE, EventKind.FINISHED, EventKind.STUDY):
        log.info("%s", event.text)


def print_progress(event: Event) -> None:
    """A ready callback: the same lines as log_progress, printed on stderr (a script's or CI job's log)."""
    if event.kind == EventKind.START:
        print(_start_line(event), file=sys.stderr, flush=True)
    elif event.kind in (EventKind.NOTE, EventKind.FINISHED, EventKind.STUDY):
        print(event.text, file=sys.stderr, flush=True)


def _start_line(event: Event) -> str:
    return f"a run into {event.folder}" if event.folder is not None else f"{event.total} points to run"


def run_ticker(on_progress: OnProgress | None, folder: Path):
    """launch_run's on_tick for a lone run into `folder`, as tick Events (None without a callback)."""
    if on_progress is None:
        return None
    return lambda elapsed_s, alive: on_progress(Event(EventKind.TICK, phase="run", elapsed_s=elapsed_s,
                                                      alive=dict(alive), folder=Path(folder)))
