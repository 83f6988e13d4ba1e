"""Running one batchlab run: its roles as processes (launcher, roles, procs), warm worker pools (pool), its
folder (run_folder), the checks before it starts (preflight, config) and what its end says (outcome, run_end).

A child that a run spawned (multiprocessing imports this package first thing, before the role's code) is
linked to its launcher at once: it gets SIGTERM when the launcher ends. Until it leads its own process group
(procs.become_group_leader) it holds SIGINT, SIGTERM and SIGHUP (procs.start): the collector
outlives a signal sent to the launcher's whole group then (the launcher stops the roles in order and the
collector writes every row). From then until its role takes over the signal, a SIGTERM ends it at once
(removing the temp folders of a launcher that is gone). Importing this package in any other process
installs no signal handler.
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


TEMP_PREFIX = "batchlab-"  # a run's temp folder: batchlab-<owner pid>-<random> (procs.run_temp_folder)
TEMP_MARKER = ".batchlab-run-temp"  # written inside it at creation: its owner's pid


def temp_owner(folder: Path) -> int | None:
    """The pid a run temp folder's marker names, when it is one batchlab made (a real folder, not a link,
    named batchlab-<pid>-*, holding a marker that names that same pid); None for anything else: a folder
    is never taken for ours by its name alone."""
    owner = folder.name[len(TEMP_PREFIX):].split("-", 1)[0]
    if not (folder.name.startswith(TEMP_PREFIX) and owner.isdigit()) or folder.is_symlink():
        return None
    try:
        marked = (folder / TEMP_MARKER).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(owner) if marked == owner else None


def remove_temp_of(owner_pid: int) -> None:
    """Remove the run temp folders (procs.run_temp_folder) of `owner_pid`: only those its marker says it made."""
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{owner_pid}-*"):
        if temp_owner(folder) == owner_pid:
            shutil.rmtree(folder, ignore_errors=True)


def _terminated_while_importing(signum, _frame) -> None:
    if os.getppid() != PARENT_PID:  # the launcher is gone: nobody else will clean up
        remove_temp_of(PARENT_PID)
    os._exit(128 + signum)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # the command stops on these as on a Ctrl-C (HUP: terminal closed)


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) to the command itself: it stops like a Ctrl-C (children stopped, what they hold
    written, temp folders removed) and exits 128 + the signal (143, 129) instead of 130."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


_TERMINATED: list[int] = []  # the signal once one came: a library (Ray) may re-raise it as a plain Ctrl-C
_INTERRUPTED: list[int] = []  # SIGINT, once a Ctrl-C came while a command ran


def _terminate(signum, _frame) -> None:
    for sig in STOP_SIGNALS:  # once: the clean-up that follows is not cut short
        signal.signal(sig, signal.SIG_IGN)
    _TERMINATED.append(signum)
    raise Terminated(signum)


def _interrupt(signum, frame) -> None:
    """Python's own Ctrl-C (KeyboardInterrupt), noted first."""
    _INTERRUPTED.append(signum)
    signal.default_int_handler(signum, frame)


def stopped_by() -> int | None:
    """The signal that came while the command ran (SIGTERM or SIGHUP before SIGINT), None when none did: one
    that cut a lazy import short can surface as another error (a C extension's SystemError, a half-initialised
    module's AttributeError), which is then the stop, not a bug."""
    return (_TERMINATED or _INTERRUPTED or [None])[0]


def stop_signal(exc: BaseException) -> signal.Signals:
    """The signal that stops the command: SIGTERM or SIGHUP (`exc` its Terminated, or one that came before
    it), else SIGINT (a Ctrl-C)."""
    if isinstance(exc, Terminated):
        return signal.Signals(exc.signum)
    return signal.Signals(_TERMINATED[0]) if _TERMINATED else signal.SIGINT


@contextlib.contextmanager
def terminated_as_interrupt():
    """While a command runs (not in a spawned child), a SIGTERM or SIGHUP is a Ctrl-C too (Terminated), and
    each of them and a Ctrl-C is noted (stopped_by); the old handlers come back after, so a process that only
    imported the CLI (a test) keeps its own. A signal whose handler is not the default is left alone (a
    caller's own; nohup's ignored SIGHUP)."""
    if SPAWNED or threading.current_thread() is not threading.main_thread():
        yield
        return
    _TERMINATED.clear()  # a command starts unterminated (a test may run several in one process)
    _INTERRUPTED.clear()
    ours = {sig: _terminate for sig in STOP_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        ours[signal.SIGINT] = _interrupt  # a Ctrl-C as Python's, noted (stopped_by)
    before = {sig: signal.signal(sig, handler) for sig, handler in ours.items()}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


if SPAWNED:
    die_with_parent()
    signal.signal(signal.SIGTERM, _terminated_while_importing)
    if os.getppid() != PARENT_PID:  # died between the two lines
        _terminated_while_importing(signal.SIGTERM, None)
