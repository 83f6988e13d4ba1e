"""The run's clock: one monotonic source for every process on a host.

All timestamps on the wire are seconds on the scheduler host's monotonic clock. Processes on the same
host share CLOCK_MONOTONIC; a remote worker converts with its measured offset. BATCHLAB_CLOCK_SKEW_S
injects a fixed skew (tests of the offset estimate).
"""
import os
import time

_SKEW_S = float(os.environ.get("BATCHLAB_CLOCK_SKEW_S", "0") or 0.0)


def now() -> float:
    """Seconds on this process's monotonic clock (plus any injected skew)."""
    return time.monotonic() + _SKEW_S


def sleep_until(deadline_s: float, spin_s: float = 0.0005) -> None:
    """Sleep until now() >= deadline_s; the last `spin_s` is a busy wait for sub-ms accuracy."""
    while True:
        left = deadline_s - now()
        if left <= 0:
            return
        if left > spin_s:
            time.sleep(left - spin_s)
