"""When each request of a run is planned to arrive: a seeded arrival process, or a window of a trace."""
import math
from dataclasses import dataclass

import numpy as np

ARRIVAL_KINDS = ("poisson", "gamma", "constant")


def _gaps(kind: str, rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` inter-arrival gaps in seconds, mean 1/rate."""
    if kind == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    # gamma: shape k = burstiness, scale 1/(rate k) -> mean 1/rate, variance 1/(rate^2 k)
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)


def _random_offsets(kind: str, rate: float, duration_s: float, burstiness: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Offsets 0, g1, g1+g2, ... below duration_s, drawing gaps in blocks until past the end."""
    expected = rate * duration_s
    block = int(expected + 6 * math.sqrt(expected / min(burstiness, 1.0)) + 16)
    parts: list[np.ndarray] = [np.zeros(1)]
    end_s = 0.0
    while end_s < duration_s:
        steps = np.cumsum(_gaps(kind, rate, burstiness, block, rng)) + end_s
        parts.append(steps)
        end_s = float(steps[-1])
    offsets = np.concatenate(parts)
    return offsets[offsets < duration_s]


def arrival_offsets(kind: str, rate: float, duration_s: float, rng: np.random.Generator,
                    *, burstiness: float = 1.0, count: int = 0) -> np.ndarray:
    """Sorted arrival offsets in [0, duration_s) seconds; the first request arrives at offset 0.

    poisson: exponential gaps, mean 1/rate. gamma: shape = burstiness, scale = 1/(rate*burstiness)
    (vLLM's --burstiness; 1 = Poisson, smaller = burstier). constant: gaps of exactly 1/rate.
    count > 0: at most the first `count` of them (a count stop beside the duration: whichever comes
    first; request k arrives when it would without the count). rate inf: `count` requests at offset 0.
    ValueError with a clear message for an impossible argument.
    """
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"unknown arrival kind {kind!r}; expected one of {', '.join(ARRIVAL_KINDS)}")
    if not rate > 0:
        raise ValueError(f"arrival rate must be a positive number of requests/s (inf: all at once), got {rate!r}")
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s!r}")
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise ValueError(f"burstiness must be > 0 (1 = Poisson, smaller = burstier), got {burstiness!r}")
    if math.isinf(rate):
        if count < 1:
            raise ValueError("rate inf (every request at t = 0) needs a request count")
        return np.zeros(count, dtype=np.float64)
    if kind == "constant":
        offsets = np.arange(math.ceil(rate * duration_s), dtype=np.float64) / rate
        offsets = offsets[offsets < duration_s]
    else:
        offsets = _random_offsets(kind, rate, duration_s, burstiness, rng)
    return offsets[:count] if count > 0 else offsets


@dataclass(slots=True)
class TraceWindow:
    """The stretch of a trace a run replays: trace requests first..first+n-1, at run offsets_s."""

    first: int  # index of the window's first request in the trace
    offsets_s: np.ndarray  # [n] run offsets in [0, duration_s), sorted
    start_s: float  # the window is [start_s, end_s) in trace seconds
    end_s: float
    speedup: float  # trace seconds per run second (1 = the trace's own timing)


def trace_window(trace_offsets_s: np.ndarray, span_s: float, start_s: float, duration_s: float,
                 rate: float) -> TraceWindow:
    """The requests of a trace (offsets in [0, span_s)) that a run of `duration_s` replays from `start_s`.

    rate 0: the trace's own timing, window [start_s, start_s + duration_s). rate > 0: the next
    round(rate * duration_s) requests from start_s, their times scaled by one factor so that they fill
    [0, duration_s): the mean rate is `rate` and the burst shape (the ratio of any two intervals' counts)
    is the trace's. ValueError when the trace cannot supply the window.
    """
    if not (math.isfinite(start_s) and 0 <= start_s < span_s):
        raise ValueError(f"trace start must be in [0, {span_s:.0f}) s, the trace's span; got {start_s!r}")
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s!r}")
    if not rate >= 0 or not math.isfinite(rate):
        raise ValueError(f"trace rate must be >= 0 requests/s (0: the trace's own), got {rate!r}")
    first = int(np.searchsorted(trace_offsets_s, start_s, side="left"))
    if rate == 0:
        end_s = start_s + duration_s
        stop = int(np.searchsorted(trace_offsets_s, end_s, side="left"))
        if stop == first:
            raise ValueError(f"the trace has no request in [{start_s:g}, {end_s:g}) s")
        return TraceWindow(first, trace_offsets_s[first:stop] - start_s, start_s, min(end_s, span_s), 1.0)
    return _rescaled_window(trace_offsets_s, span_s, start_s, duration_s, rate, first)


def _rescaled_window(trace_offsets_s: np.ndarray, span_s: float, start_s: float, duration_s: float,
                     rate: float, first: int) -> TraceWindow:
    """rate > 0: n = round(rate * duration_s) requests, scaled to fill [0, duration_s)."""
    n = round(rate * duration_s)
    available = len(trace_offsets_s) - first
    if n < 1 or n > available:
        raise ValueError(f"rate {rate:g} req/s for {duration_s:g} s needs {n} requests; the trace holds "
                         f"{available} from {start_s:g} s (lower the rate or the duration, or start earlier)")
    last_s = float(trace_offsets_s[first + n - 1])
    # the window closes at the next later arrival (or the trace's end), so every kept request maps below duration_s
    later = int(np.searchsorted(trace_offsets_s, last_s, side="right"))
    end_s = float(trace_offsets_s[later]) if later < len(trace_offsets_s) else span_s
    speedup = (end_s - start_s) / duration_s
    offsets = (trace_offsets_s[first:first + n] - start_s) / speedup
    return TraceWindow(first, np.minimum(offsets, np.nextafter(duration_s, 0.0)), start_s, end_s, speedup)
