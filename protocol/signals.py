"""How every process stops: SIGINT/SIGTERM only set a flag; the loop notices and cleans up in `finally`."""
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def on_stop_signal(callback: Callable[[int], None]) -> Iterator[None]:
    """Inside the block SIGINT/SIGTERM call `callback(signum)`; the old handlers come back after.
    Off the main thread (where Python allows no handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, lambda signum, _frame: callback(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
