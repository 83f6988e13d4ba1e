"""The `batchlab` command line.

A Ctrl-C while it is still importing (a second or so, before any process or file exists) ends it quietly
with exit code 130; main.py hands SIGINT back to Python once imported. A child that `batchlab run`
spawned (multiprocessing imports this package first thing, before the role's code) is linked to its
launcher at once: it gets SIGTERM when the launcher ends, and until its role takes over the signal, a
SIGTERM ends it at once (removing the temp folders of a launcher that is gone); it inherits SIGINT
ignored (procs.start) and keeps it so until it leads its own process group (procs.become_group_leader).
"""
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # Linux prctl: a signal this process gets when its parent dies
SPAWNED = "--multiprocessing-fork" in sys.argv  # a multiprocessing child (spawn start method)
PARENT_PID = os.getppid()  # the launcher, unless it died before this line (procs.orphaned checks again)


def die_with_parent() -> None:
    """Linux: SIGTERM to this process when its parent ends (idempotent)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def remove_temp_of(owner_pid: int) -> None:
    """Remove the run temp folders (procs.run_temp_folder) of `owner_pid`."""
    for folder in Path(tempfile.gettempdir()).glob(f"batchlab-{owner_pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)


def _terminated_while_importing(signum, _frame) -> None:
    if os.getppid() != PARENT_PID:  # the launcher is gone: nobody else will clean up
        remove_temp_of(PARENT_PID)
    os._exit(128 + signum)


def _interrupted_while_importing(_signum, _frame) -> None:
    sys.stderr.write("error: interrupted\n")
    os._exit(130)


class Terminated(KeyboardInterrupt):
    """SIGTERM to the command itself: it stops like a Ctrl-C (children stopped, what they hold written,
    temp folders removed) and exits 143 instead of 130."""


_TERMINATED: list[bool] = []  # set once a SIGTERM came: a library (Ray) may re-raise it as a plain Ctrl-C


def _terminate(_signum, _frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up that follows is not cut short
    _TERMINATED.append(True)
    raise Terminated()


def was_terminated(exc: BaseException) -> bool:
    """Whether the command stops for a SIGTERM (`exc` its Terminated, or one that came before it)."""
    return isinstance(exc, Terminated) or bool(_TERMINATED)


@contextlib.contextmanager
def terminated_as_interrupt():
    """While a command runs (not in a spawned child), a SIGTERM is a Ctrl-C too (Terminated); the old
    handler comes back after, so a process that only imported the CLI (a test) keeps its own."""
    if SPAWNED or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    _TERMINATED.clear()  # a command starts unterminated (a test may run several in one process)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def restore_sigint() -> None:
    """Python's own Ctrl-C (KeyboardInterrupt) again, unless SIGINT was ignored by whoever started us."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_importing:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if SPAWNED:
    die_with_parent()
    signal.signal(signal.SIGTERM, _terminated_while_importing)
    if os.getppid() != PARENT_PID:  # died between the two lines
        _terminated_while_importing(signal.SIGTERM, None)
elif signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_importing)
