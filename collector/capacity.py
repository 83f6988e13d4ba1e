"""A strategy's capacity: whether one run sustained its arrival rate (the verdict), and the bracketing
search over rates that finds the highest rate sustained. Pure: tables in, numbers out; the search calls
a `measure(rate)` it is given (a live point, or a simulated one) and opens nothing itself.

Sustained means: served ≥ SERVED_MIN of the requests planned, the waiting queue not growing over the
second half of the traffic (the least-squares slope of the queue length read just after each launch, so
a static batch's fill-and-empty sawtooth does not count, times that half's length: at most
max(QUEUE_SLACK, QUEUE_GROWTH_SHARE × the half's arrivals)), and, with SLOs, goodput ≥ GOODPUT_MIN. The search grows geometrically from a start rate until it has a sustained and an
unsustained rate, then bisects in log space until hi / lo ≤ 1 + width or max_probes runs were made.
Capacity is the bracket [highest sustained, lowest unsustained], in the arrival rates those runs offered (a
seeded Poisson schedule of a few seconds is some percent off its nominal rate, the same for every strategy),
its point estimate the geometric mean.
"""
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from batchlab.collector.metrics import NO_TERMINAL, NOT_SENT, goodput, submitted_mask

SERVED_MIN = 0.99
GOODPUT_MIN = 0.90
QUEUE_SLACK = 4.0  # requests: a stable queue read after each launch wanders about this much in a short run
QUEUE_GROWTH_SHARE = 0.03  # of the second half's arrivals: growth below this is noise, not a trend
QUEUE_SAMPLES = 256  # points of the queue-length curve the slope is fitted to (too few launches to read after)
MIN_LAUNCHES = 4
GROW_FACTOR = 1.5  # rate step while the bracket is open on one side
WIDTH = 0.15  # stop when hi / lo ≤ 1 + WIDTH
MAX_PROBES = 6


@dataclass(slots=True)
class Verdict:
    """Whether a run sustained its rate, and why not."""

    sustained: bool
    reasons: list[str]
    served_share: float
    queue_growth: float  # requests gained by the waiting queue over the traffic's second half
    goodput: float | None = None
    offered_req_s: float | None = None  # arrivals ÷ duration: a seeded Poisson schedule is off its nominal rate


def _leave_times(sub: pd.DataFrame) -> np.ndarray:
    """When each request stopped waiting: its launch; at once when it failed unlaunched on arrival (queue
    full, rejected); never when the run ended with it still waiting."""
    left = sub["scheduled_time"].to_numpy(dtype="float64").copy()
    error = sub["error"].astype(str).to_numpy() if "error" in sub else np.full(len(sub), "")
    unlaunched = np.isnan(left)
    at_once = unlaunched & (sub["status"].to_numpy() != "finished") & ~np.isin(error, [NO_TERMINAL, NOT_SENT])
    left[at_once] = sub["arrival_time"].to_numpy(dtype="float64")[at_once]
    left[unlaunched & ~at_once] = np.inf
    return left


def waiting(requests: pd.DataFrame, times_s: np.ndarray) -> np.ndarray:
    """Requests waiting for a launch at each of `times_s` (arrived, not yet launched)."""
    sub = requests[submitted_mask(requests)]
    arrivals = np.sort(sub["arrival_time"].dropna().to_numpy(dtype="float64"))
    left = np.sort(_leave_times(sub[sub["arrival_time"].notna()]))
    return (np.searchsorted(arrivals, times_s, side="right") - np.searchsorted(left, times_s, side="right"))


def _sample_times(requests: pd.DataFrame, start_s: float, end_s: float) -> np.ndarray:
    """When to read the queue: just after each launch in [start_s, end_s] (what a batch leaves behind, free
    of the fill-and-empty sawtooth of static batches), else evenly spaced when fewer than MIN_LAUNCHES."""
    launches = np.unique(requests["scheduled_time"].dropna().to_numpy(dtype="float64"))
    launches = launches[(launches >= start_s) & (launches <= end_s)]
    return launches if launches.size >= MIN_LAUNCHES else np.linspace(start_s, end_s, QUEUE_SAMPLES)


def queue_growth(requests: pd.DataFrame, duration_s: float) -> tuple[float, int]:
    """(requests the queue gained over [duration_s / 2, duration_s] by the least-squares slope of its length
    after each launch, arrivals there)."""
    half_s = duration_s / 2
    times = _sample_times(requests, half_s, duration_s)
    slope = np.polyfit(times, waiting(requests, times).astype("float64"), 1)[0] if half_s > 0 else 0.0
    arrivals = requests["arrival_time"].to_numpy(dtype="float64")
    return float(slope * half_s), int(((arrivals >= half_s) & (arrivals <= duration_s)).sum())


def sustain(requests: pd.DataFrame, duration_s: float, slos: dict | None = None) -> Verdict:
    """The verdict on one run's requests table (every planned request a row; times in s since t0)."""
    n = len(requests)
    served = float((requests["status"] == "finished").sum() / n) if n else 0.0
    growth, arrived = queue_growth(requests, duration_s) if n else (0.0, 0)
    reasons = []
    if served < SERVED_MIN:
        reasons.append(f"served {served:.1%} < {SERVED_MIN:.0%}")
    limit = max(QUEUE_SLACK, QUEUE_GROWTH_SHARE * arrived)
    if growth > limit:
        reasons.append(f"queue grew by {growth:.1f} requests over the second half (limit {limit:.1f})")
    share = goodput(requests, slos)["fraction"] if slos and n else None
    if share is not None and share < GOODPUT_MIN:
        reasons.append(f"goodput {share:.1%} < {GOODPUT_MIN:.0%}")
    arrivals = requests["arrival_time"].to_numpy(dtype="float64")
    offered = float(((arrivals >= 0) & (arrivals <= duration_s)).sum() / duration_s) if duration_s > 0 else None
    return Verdict(not reasons, reasons, served, growth, share, offered)


@dataclass(slots=True)
class Probe:
    """One measured rate of a search."""

    rate_req_s: float  # the nominal rate asked for (the schedule's λ)
    verdict: Verdict
    folder: str = ""
    tokens_per_request: float | None = None  # mean output tokens of its finished requests

    @property
    def offered_req_s(self) -> float:
        """The arrival rate the worker actually faced (the nominal rate when not measured)."""
        return self.verdict.offered_req_s or self.rate_req_s


@dataclass(slots=True)
class Capacity:
    """A strategy's capacity bracket [lo, hi] (offered req/s; None: open on that side) and the probes behind it."""

    label: str
    lo_req_s: float | None
    hi_req_s: float | None
    probes: list[Probe] = field(default_factory=list)
    start_req_s: float | None = None
    note: str = ""  # why there is no bracket (the burst that places the first probe failed)

    @property
    def estimate_req_s(self) -> float | None:
        """The bracket's geometric mean (None while it is open)."""
        return math.sqrt(self.lo_req_s * self.hi_req_s) if self.lo_req_s and self.hi_req_s else None

    def tokens_per_request(self) -> float | None:
        """Mean output tokens per finished request over the probes (the same trace for every strategy)."""
        values = [p.tokens_per_request for p in self.probes if p.tokens_per_request]
        return float(np.mean(values)) if values else None

    def as_dict(self) -> dict:
        """capacity.json's entry: the bracket and estimate in req/s and tok/s, and every probe."""
        tpr = self.tokens_per_request()
        tok = {f"{k}_tok_s": (v * tpr if v is not None and tpr else None)
               for k, v in (("lo", self.lo_req_s), ("hi", self.hi_req_s), ("estimate", self.estimate_req_s))}
        probes = [{"rate_req_s": p.rate_req_s, "folder": p.folder, "tokens_per_request": p.tokens_per_request,
                   **asdict(p.verdict)} for p in self.probes]
        return {"label": self.label, "lo_req_s": self.lo_req_s, "hi_req_s": self.hi_req_s,
                "estimate_req_s": self.estimate_req_s, **tok, "tokens_per_request": tpr,
                "start_req_s": self.start_req_s, "probes": probes, **({"note": self.note} if self.note else {})}


def bracket(probes: list[Probe]) -> tuple[float | None, float | None]:
    """(highest sustained nominal rate below the lowest unsustained one, lowest unsustained nominal rate)."""
    failing = [p.rate_req_s for p in probes if not p.verdict.sustained]
    hi = min(failing, default=None)
    lo = max((p.rate_req_s for p in probes if p.verdict.sustained and (hi is None or p.rate_req_s < hi)),
             default=None)
    return lo, hi


def capacity_of(label: str, probes: list[Probe], start_req_s: float | None = None) -> Capacity:
    """The bracket of these probes in the rates they offered (every strategy replays the same schedule, so
    its arrivals are the same multiple of the nominal rate for all)."""
    offered = {p.rate_req_s: p.offered_req_s for p in probes}
    lo, hi = bracket(probes)
    return Capacity(label, offered.get(lo), offered.get(hi), probes, start_req_s)


def _rounded(rate: float) -> float:
    return float(f"{rate:.3g}")


def next_rate(probes: list[Probe], start_req_s: float, *, width: float = WIDTH, max_probes: int = MAX_PROBES,
              factor: float = GROW_FACTOR) -> float | None:
    """The next rate to measure, or None when the bracket is narrow enough or the probes are spent."""
    if len(probes) >= max_probes:
        return None
    if not probes:
        return _rounded(start_req_s)
    lo, hi = bracket(probes)
    if hi is None:
        return _rounded(lo * factor)
    if lo is None:
        return _rounded(hi / factor)
    if hi / lo <= 1 + width:
        return None
    rate = _rounded(math.sqrt(lo * hi))
    return rate if lo < rate < hi else None  # 3 significant digits leave nothing between them


Measure = Callable[[float], Probe]


def search(label: str, start_req_s: float, measure: Measure, *, width: float = WIDTH,
           max_probes: int = MAX_PROBES, factor: float = GROW_FACTOR) -> Capacity:
    """Measure rates from start_req_s on until next_rate says stop; the bracket they give."""
    if not start_req_s > 0:
        raise ValueError(f"a capacity search needs a positive start rate, got {start_req_s}")
    probes: list[Probe] = []
    while (rate := next_rate(probes, start_req_s, width=width, max_probes=max_probes, factor=factor)) is not None:
        probes.append(measure(rate))
    return capacity_of(label, probes, start_req_s)


def tokens_per_request(requests: pd.DataFrame) -> float | None:
    """Mean output tokens of the finished requests (None when none finished)."""
    done = requests[requests["status"] == "finished"]
    return float(done["n_tokens"].mean()) if len(done) else None


def from_runs(label: str, runs: list[tuple[float, pd.DataFrame, float]], slos: dict | None = None) -> Capacity:
    """A bracket from fixed grid rates: (rate, requests table, duration_s) per run; a rate with several
    repeats is sustained only when every repeat is."""
    by_rate: dict[float, list[Probe]] = {}
    for rate, requests, duration_s in runs:
        by_rate.setdefault(rate, []).append(Probe(rate, sustain(requests, duration_s, slos),
                                                  tokens_per_request=tokens_per_request(requests)))
    probes = [next((p for p in ps if not p.verdict.sustained), ps[0]) for _, ps in sorted(by_rate.items())]
    return capacity_of(label, probes)
