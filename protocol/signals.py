"""A process's signal state and every handler batchlab puts in place, in one module; nothing here runs at import.

- A role's loop (the collector, scheduler, worker and traffic processes): STOP_SIGNALS (a Ctrl-C, a kill, a
  closed terminal) end it through a flag (on_stop_signal; cleanup in `finally`), last_stop_signal its exit code.
- A process a run spawned (runner.procs.become_group_leader, first thing in the child): linked to its launcher
  (link_spawned_child), it takes the signals held since its spawn (release_spawn_hold), then leads its group.
- The launcher (runner.procs): signals held while a child spawns (signals_held, sigint_deferred), a second
  Ctrl-C while it stops its children (Hurry), SIGINT ignored while it cleans up (sigint_ignored).
- A command (the batchlab executable: cli.entry, cli.main): a SIGTERM or SIGHUP as a Ctrl-C of its own
  (terminated_as_interrupt: Terminated, a KeyboardInterrupt that exits 128 + the signal), noted (stopped_by),
  and a Ctrl-C while it imports or once it has ended a quiet exit 130 (exit_on_sigint_while_importing).

Each is installed explicitly by a process's entry (the command's, a role's, the launcher's), never by an import:
importing batchlab (a notebook, a test) changes no handler, and every handler put in place for a while is
given back after.
"""
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a Ctrl-C, a kill, a closed terminal
TERMINATE_SIGNALS = STOP_SIGNALS[1:]  # the ones a command takes as a Ctrl-C of its own (Terminated)
PR_SET_PDEATHSIG = 1  # Linux prctl: a signal this process gets when its parent dies
_received: list[int] = []  # the stop signals this process got inside on_stop_signal, in order


# A role's loop (the collector, scheduler, worker and traffic processes).
def last_stop_signal() -> int:
    """The last stop signal this process got inside on_stop_signal (0: none): a command's exit code."""
    return _received[-1] if _received else 0


def _note(signum: int, callback: Callable[[int], None]) -> None:
    _received.append(signum)
    callback(signum)


@contextlib.contextmanager
def on_stop_signal(callback: Callable[[int], None]) -> Iterator[None]:
    """Inside the block a stop signal calls `callback(signum)`; the old handlers come back after. Off the main
    thread (where Python allows no handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, lambda signum, _frame: _note(signum, callback)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# A process a run spawned.
def die_with_parent() -> None:
    """Linux: SIGTERM to this process when its parent ends (idempotent)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def link_spawned_child(parent_pid: int, on_orphaned: Callable[[], None]) -> None:
    """In a child a run spawned, first thing: SIGTERM when the launcher ends, and until the role takes the signal
    over, a SIGTERM ends it at once (after `on_orphaned()` when the launcher is gone: nobody else cleans up)."""
    def terminated_before_the_role(signum, _frame) -> None:
        if os.getppid() != parent_pid:
            on_orphaned()
        os._exit(128 + signum)

    die_with_parent()
    signal.signal(signal.SIGTERM, terminated_before_the_role)
    if os.getppid() != parent_pid:  # died before the prctl took effect, or between the two lines
        terminated_before_the_role(signal.SIGTERM, None)


HELD_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP})  # blocked from a spawn until the child leads its group


def release_spawn_hold(ends_on_held: bool) -> int | None:
    """In a spawned child about to lead its own group: SIGINT ignored (a Ctrl-C held since the spawn is dropped:
    the launcher got it too), then each SIGTERM or SIGHUP held since the spawn taken: with `ends_on_held`, the
    first that this process does not ignore is returned (the caller ends the process; the rest stay held);
    otherwise they are dropped, SIGINT, SIGTERM and SIGHUP unblocked, and None returned. SIGINT stays ignored
    until sigint_as_python."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while held := HELD_SIGNALS & signal.sigpending():
        info = signal.sigtimedwait(held, 0)  # a signal ignored here (nohup's SIGHUP) is held all the same
        if info is not None and ends_on_held and signal.getsignal(info.si_signo) != signal.SIG_IGN:
            return info.si_signo
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS | {signal.SIGINT})
    return None


def sigint_as_python() -> None:
    """Python's own Ctrl-C (KeyboardInterrupt) again: a spawned child once the terminal's Ctrl-C cannot reach it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The launcher, while it spawns and stops the processes of a run.
@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGTERM and SIGHUP wait inside (blocked); a process started inside inherits them held."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Inside, a process started inherits SIGINT blocked (release_spawn_hold drops a Ctrl-C it got before it
    led its own group), while this one's Ctrl-C is noted and raised again once the block ends: a spawn takes
    a while on a busy machine, and a Ctrl-C then is still the user's (main thread only; whichever thread the
    kernel hands the signal to, Python runs the handler in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: pressed.append(signum))
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # what a child started inside inherits
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a Ctrl-C that waited here is noted now
        signal.signal(signal.SIGINT, old)
    if pressed:
        signal.raise_signal(signal.SIGINT)  # to the handler we had: KeyboardInterrupt, unless it is ignored


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT is ignored inside (main thread only; elsewhere Python allows no handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


class Hurry:
    """While stopping: SIGINT (in the main thread) sets `pressed` instead of raising KeyboardInterrupt, so a
    second Ctrl-C cannot leave a child group unreaped; the handler before is restored on exit."""

    def __init__(self, on_press: Callable[[], None] = lambda: None) -> None:
        self.pressed, self.before, self.on_press = False, None, on_press

    def __enter__(self) -> "Hurry":
        if threading.current_thread() is threading.main_thread():
            self.before = signal.signal(signal.SIGINT, self._press)
        return self

    def _press(self, _signum, _frame) -> None:
        self.pressed = True
        self.on_press()

    def __exit__(self, *exc) -> None:
        if self.before is not None:
            signal.signal(signal.SIGINT, self.before)


# A command (the batchlab executable).
class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) to the command itself: it stops like a Ctrl-C (children stopped, what they hold
    written, temp folders removed) and exits 128 + the signal (143, 129) instead of 130."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


_TERMINATED: list[int] = []  # the signal once one came: a library (Ray) may re-raise it as a plain Ctrl-C
_INTERRUPTED: list[int] = []  # SIGINT, once a Ctrl-C came while a command ran
_COMMANDS: list[bool] = []  # one entry while a command runs (terminated_as_interrupt): raise_if_stopped's scope


def _terminate(signum, _frame) -> None:
    for sig in TERMINATE_SIGNALS:  # once: the clean-up that follows is not cut short
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


def raise_if_stopped() -> None:
    """Raise again the stop a command got that never reached it: a library swallowed the KeyboardInterrupt (seen
    mid-import, inside numpy's Cython module set-up under pandas; the run then went on to exit 0). The launcher
    calls it before it spawns and on every tick of its watch; outside a command (nothing noted) it does nothing."""
    signum = stopped_by() if _COMMANDS else None  # a command that ended (a test's) leaves its signals noted
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum is not None:
        raise Terminated(signum)


def stop_signal(exc: BaseException) -> signal.Signals:
    """The signal that stops the command: SIGTERM or SIGHUP (`exc` its Terminated, or one that came before
    it), else SIGINT (a Ctrl-C)."""
    if isinstance(exc, Terminated):
        return signal.Signals(exc.signum)
    return signal.Signals(_TERMINATED[0]) if _TERMINATED else signal.SIGINT


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """While a command runs (not in a child a run spawned), a SIGTERM or SIGHUP is a Ctrl-C too
    (Terminated), and each of them and a Ctrl-C is noted (stopped_by); the old handlers come back after, so a
    process that only imported the CLI (a test) keeps its own. A signal whose handler is not the default is
    left alone (a caller's own; nohup's ignored SIGHUP)."""
    if _spawned() or threading.current_thread() is not threading.main_thread():
        yield
        return
    _TERMINATED.clear()  # a command starts unterminated (a test may run several in one process)
    _INTERRUPTED.clear()
    ours = {sig: _terminate for sig in TERMINATE_SIGNALS if signal.getsignal(sig) is signal.SIG_DFL}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        ours[signal.SIGINT] = _interrupt  # a Ctrl-C as Python's, noted (stopped_by)
    before = {sig: signal.signal(sig, handler) for sig, handler in ours.items()}
    _COMMANDS.append(True)
    try:
        yield
    finally:
        _COMMANDS.pop()
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _spawned() -> bool:
    """Whether this process is a multiprocessing child (spawn start method): a run's role or a pool's process."""
    return "--multiprocessing-fork" in sys.argv


def _interrupted_outside_the_command(_signum, _frame) -> None:
    with contextlib.suppress(Exception):  # what the command printed before is kept (os._exit flushes nothing)
        sys.stdout.flush()
    sys.stderr.write("error: interrupted\n")
    os._exit(130)


def exit_on_sigint_while_importing() -> None:
    """The command, as it starts importing (before any process or file exists) and again once it has ended: a
    Ctrl-C then ends it quietly (130, no traceback), unless SIGINT is not Python's own (ignored by whoever
    started it)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_outside_the_command)


def forget_handled_interrupt() -> None:
    """CPython before 3.14 (gh-128130) marks a KeyboardInterrupt that passed through an exec() or eval() of a
    string (a dataclass or a namedtuple being made as a module imports) as unhandled for good, even once caught:
    under `python -m` the interpreter then kills itself with SIGINT as it exits, whatever exit code the command
    chose (a Ctrl-C the command turned into 130 ended as a silent death by SIGINT). Called once the command has
    chosen its code; where the flag is not a symbol of the interpreter (3.13's runtime struct) nothing happens."""
    with contextlib.suppress(ValueError, AttributeError, OSError):
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0


def restore_sigint() -> None:
    """Python's own Ctrl-C (KeyboardInterrupt) again, from where the command line's parser catches it (inside
    typer's main), unless SIGINT was ignored by whoever started it."""
    if signal.getsignal(signal.SIGINT) is _interrupted_outside_the_command:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# For a while, anywhere.
@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Inside, a Ctrl-C is held (a clean-up must not be cut short) and raised again after it; a SIGINT this
    process ignores stays ignored. Off the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if pressed and old is not signal.SIG_IGN:
        signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def handler_kept(signum: int) -> Iterator[None]:
    """Whatever code inside puts in place for `signum` (a library's own handler: ray.init's SIGTERM), the
    handler before comes back after."""
    before = signal.getsignal(signum)
    try:
        yield
    finally:
        if before is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signum, before)
