"""Every error batchlab raises for a user's input or a run's fault, in one hierarchy under BatchlabError.

Each class also keeps its built-in base (a ConfigError is a ValueError, a RunFailed a RuntimeError), so code
that caught the built-in still does. The command line catches BatchlabError alone (one `error:` line); any
other exception reaching it is a bug in batchlab and is shown as one, with its traceback.

A message names a setting in its reader's vocabulary (`term`): the Python name (`rate`, `duration_s`) for a
caller of batchlab.api or the library, the option (`--rate`, `--duration`) inside a command, which sets the
command-line vocabulary for its whole run (`command_line_vocabulary`).
"""
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

PYTHON, COMMAND_LINE = "python", "command line"
_VOCABULARY: ContextVar[str] = ContextVar("batchlab_vocabulary", default=PYTHON)


def term(flag: str, python: str) -> str:
    """A setting's or parameter's name in a message: `flag` inside a command, `python` everywhere else."""
    return flag if _VOCABULARY.get() == COMMAND_LINE else python


@contextlib.contextmanager
def command_line_vocabulary() -> Iterator[None]:
    """Inside, messages name settings by their options (a command's run; the old vocabulary comes back after)."""
    token = _VOCABULARY.set(COMMAND_LINE)
    try:
        yield
    finally:
        _VOCABULARY.reset(token)


SHOWN_REPR_CHARS = 40  # a value's repr shown beside its type in a message at most this long, on one line


def shown(value: object) -> str:
    """A wrong argument as a message names it: its type, with its repr only where that is short and one line
    ('int 3', 'DataFrame': a frame's repr is many lines)."""
    text = repr(value)
    brief = "\n" not in text and len(text) <= SHOWN_REPR_CHARS
    return f"{type(value).__name__} {text}" if brief else type(value).__name__


UNGUARDED_MAIN_EXIT = 66  # a spawned process that found itself re-running the caller's script (api.guard)
UNGUARDED_MAIN = ("a process batchlab spawned re-ran your script's top level (spawning imports the script): put "
                  "the script's batchlab calls under `if __name__ == \"__main__\":` (docs/processes.md)")


class BatchlabError(Exception):
    """The root of every error a user's input or a run's fault causes (batchlab.api's one hierarchy)."""


# Input refused before anything starts.
class ConfigError(BatchlabError, ValueError):
    """A setting, settings file, path or argument that cannot work; the command line prints it as one line."""


class InsecureAddress(ConfigError):
    """A non-loopback bind without keys."""


class SweepError(BatchlabError, ValueError):
    """A sweep plan (or a sweep folder) that cannot run."""


class ClusterError(SweepError):
    """Ray is missing or the cluster cannot be reached."""


class DatasetError(BatchlabError):
    """A prompt source that cannot be used (missing, empty, unreadable or tampered)."""


class BackendError(BatchlabError):
    """A backend cannot start (bad model name, missing package, unreachable endpoint)."""


class CalibrateError(BatchlabError, ValueError):
    """Runs that cannot be calibrated from."""


class PublishedError(BatchlabError, ValueError):
    """A file of published GPU measurements that cannot be read as configurations (simulator.measurements)."""


# Files batchlab reads back.
class SummaryError(BatchlabError, ValueError):
    """A summary.json that is missing or not a batchlab summary."""


class ReportError(BatchlabError, ValueError):
    """A folder the report refuses: `lines` says why, one line per bad file (the command line prints each)."""

    def __init__(self, *lines: str) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


class RunRefused(ReportError):
    """One run folder whose files the report cannot read: one line."""


class PoolingError(ReportError):
    """Runs that claim to be one point but are not."""


# A run's faults.
class ProtocolError(BatchlabError, ValueError):
    """A frame that is malformed, truncated, oversized, of another version or of an unknown kind (the
    receiving loop logs and counts it, and goes on)."""


class RunFailed(BatchlabError, RuntimeError):
    """A run's process died; the message names it."""


class RunTimeout(BatchlabError, RuntimeError):
    """A run passed one of its limits: `phase` says which ("startup": the workers never got ready, or
    "run": the traffic had started); a stopped run keeps what finished."""

    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.phase = phase

    def __reduce__(self):  # pickled across processes (Ray) with its phase
        return type(self), (str(self), self.phase)


class TrafficStartTimeout(BatchlabError, RuntimeError):
    """The scheduler did not send Start in time."""
