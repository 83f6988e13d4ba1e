"""How every process stops: SIGINT/SIGTERM only set a flag; the loop notices and cleans up in `finally`."""
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the stop signals this process got, in order


def last_stop_signal() -> int:
    """The last stop signal this process got inside on_stop_signal (0: none): a command's exit code."""
    return _received[-1] if _received else 0


def _note(signum: int, callback: Callable[[int], None]) -> None:
    _received.append(signum)
    callback(signum)


@contextmanager
def on_stop_signal(callback: Callable[[int], None]) -> Iterator[None]:
    """Inside the block SIGINT/SIGTERM call `callback(signum)`; the old handlers come back after.
    Off the main thread (where Python allows no handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, lambda signum, _frame: _note(signum, callback)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
