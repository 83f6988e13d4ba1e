"""Seeded arrival processes: when each request of a run is planned to arrive."""
import math

import numpy as np

ARRIVAL_KINDS = ("poisson", "gamma", "constant")


def _check(kind: str, rate: float, duration_s: float, burstiness: float) -> None:
    """Raise ValueError with a clear message for an impossible argument."""
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"unknown arrival kind {kind!r}; expected one of {', '.join(ARRIVAL_KINDS)}")
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"arrival rate must be a positive number of requests/s, got {rate!r}")
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s!r}")
    if not burstiness > 0 or not math.isfinite(burstiness):
        raise ValueError(f"burstiness must be > 0 (1 = Poisson, smaller = burstier), got {burstiness!r}")


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
                    *, burstiness: float = 1.0) -> np.ndarray:
    """Sorted arrival offsets in [0, duration_s) seconds; the first request arrives at offset 0.

    poisson: exponential gaps, mean 1/rate. gamma: shape = burstiness, scale = 1/(rate*burstiness)
    (vLLM's --burstiness; 1 = Poisson, smaller = burstier). constant: gaps of exactly 1/rate.
    """
    _check(kind, rate, duration_s, burstiness)
    if kind == "constant":
        n = math.ceil(rate * duration_s)
        offsets = np.arange(n, dtype=np.float64) / rate
        return offsets[offsets < duration_s]
    return _random_offsets(kind, rate, duration_s, burstiness, rng)
