"""Whether one run sustained its arrival rate: the sustain verdict and its reasons. Pure: a requests table in,
a Verdict out (stats/capacity.py brackets a strategy's capacity from the verdicts of its probes; lab/rate_search.py
chooses the rates to measure).

docs/capacity.md ("The sustain verdict") gives the rules: served ≥ SERVED_MIN; the waiting queue's trend after
WARMUP_SHARE, read just after each launch, with a Newey-West (HAC) interval since the queue length is
autocorrelated, not wholly above GROWTH_SHARE of the offered rate; the offered rate not above μ's interval;
goodput ≥ GOODPUT_MIN with SLOs; undecided when too few requests arrived after the warm-up, or when the queue
needs longer than the run to settle."""
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchlab.protocol.status import FailureReason, RequestStatus
from batchlab.protocol.verdicts import Sustain
from batchlab.stats.intervals import LEVEL, t_quantile
from batchlab.stats.metrics import goodput, submitted_mask

SERVED_MIN = 0.99
GOODPUT_MIN = 0.90
# arrivals after the warm-up below which a run cannot tell a rate kept up with from one that was not: at least
# this many, and two of its largest launches (a static batcher's queue fills and empties a batch at a time)
MIN_JUDGED = 10
# the judged window must hold this many of the queue's settle times (settle_time_s) for its verdict to stand for
# a longer run's: the queue's rare climbs to a limit (what fails a run near capacity) show only over several.
# With 2, 12 s and 60 s searches' intervals both hold a 600 s search's estimate (tests/test_saturation.py)
SETTLE_TIMES = 2.0
# of the offered rate: a queue gaining less than this is not told apart from one still filling towards its
# steady level (near capacity that takes longer than a probe); overload closer than that is μ's to catch
GROWTH_SHARE = 0.05
WARMUP_SHARE = 0.25  # of the traffic, before the queue's trend is read: it fills to its steady level first
QUEUE_SAMPLES = 256  # points of the queue-length curve the slope is fitted to (too few launches to read after)
MIN_LAUNCHES = 4


@dataclass(slots=True)
class Verdict:
    """Whether a run sustained its rate, and why not; or that it could not tell (`judged` False: too few
    requests, or a queue that needs longer than the run to settle), which is neither."""

    sustained: bool
    reasons: list[str]
    served_share: float
    queue_growth: float  # requests/s: the waiting queue's trend after the warm-up
    goodput: float | None = None
    offered_req_s: float | None = None  # arrivals ÷ duration: a seeded Poisson schedule is off its nominal rate
    queue_growth_lo: float = 0.0  # the trend's 95% interval (HAC); 0 when not read (a failed run)
    queue_growth_hi: float = 0.0
    judged: bool = True  # False: the run could not tell (`reasons` says why); never sustained then

    @property
    def failed(self) -> bool:
        """Judged and not sustained: a rate known to be too high."""
        return self.judged and not self.sustained

    @property
    def outcome(self) -> Sustain:
        """Sustained, not sustained or undecided."""
        return Sustain.of(self.sustained, self.judged)

    @property
    def mark(self) -> str:
        """✓ sustained, ✗ not, ? undecided (the report's list of rates measured)."""
        return self.outcome.mark


def settle_time_s(offered_req_s: float, mu_req_s: float, arrival_cv2: float = 1.0) -> float:
    """How long the waiting queue takes to reach its steady level at this load: the relaxation time of the
    queue's heavy-traffic (reflected Brownian motion) model, 2σ² ÷ (μ − λ)², with σ² = λ·(c_a² + 1) (the
    arrivals' variability, and the departures' taken as Poisson's: a batching worker's lumpy completions
    vary at least as much); inf at or above μ. A run whose judged window is shorter than this cannot see the
    queue's steady level, so cannot tell whether it stays under a queue limit."""
    gap = mu_req_s - offered_req_s
    if gap <= 0:
        return math.inf
    return 2 * offered_req_s * (arrival_cv2 + 1) / (gap * gap)


def _leave_times(sub: pd.DataFrame) -> np.ndarray:
    """When each request stopped waiting: its launch; at once when it failed unlaunched on arrival (queue
    full, rejected); never when the run ended with it still waiting."""
    left = sub["scheduled_time"].to_numpy(dtype="float64").copy()
    error = sub["error"].astype(str).to_numpy() if "error" in sub else np.full(len(sub), "")
    unlaunched = np.isnan(left)
    waited_out = np.isin(error, [FailureReason.NO_TERMINAL, FailureReason.NOT_SENT])
    at_once = unlaunched & (sub["status"].to_numpy() != RequestStatus.FINISHED) & ~waited_out
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


def trend(times_s: np.ndarray, values: np.ndarray) -> tuple[float, float, float]:
    """(slope, lo, hi): the least-squares slope of values over times_s with a 95% interval from Newey-West
    standard errors (Bartlett weights, √n lags: a queue's length is strongly autocorrelated, and more
    lags widen the interval rather than fake a trend); (0, -inf, inf) with fewer than 4 points."""
    x = np.asarray(times_s, dtype="float64") - np.mean(times_s)
    y = np.asarray(values, dtype="float64")
    sxx = float((x * x).sum())
    if x.size < 4 or sxx <= 0:
        return 0.0, -math.inf, math.inf
    slope = float((x * (y - y.mean())).sum() / sxx)
    u = x * (y - y.mean() - slope * x)  # score of each point
    lags = int(math.ceil(math.sqrt(x.size)))
    s = float((u * u).sum()) + 2 * sum((1 - lag / (lags + 1)) * float((u[lag:] * u[:-lag]).sum())
                                       for lag in range(1, min(lags, x.size - 1) + 1))
    half = t_quantile(LEVEL, x.size - 2) * math.sqrt(max(s, 0.0)) / sxx
    return slope, slope - half, slope + half


def largest_launch(requests: pd.DataFrame) -> int:
    """The most requests launched at one moment (a static batch's size; 0 when none launched)."""
    launched = requests["scheduled_time"].dropna()
    return int(launched.value_counts().max()) if len(launched) else 0


def queue_trend(requests: pd.DataFrame, duration_s: float) -> tuple[float, float, float]:
    """The trend of the waiting queue beyond what one launch takes, over [WARMUP_SHARE × duration_s,
    duration_s] (requests/s, with its 95% interval), read just after each launch. A static batcher that keeps
    up holds up to a batch while it fills: at a low rate, few launches and a rising fill read as a trend of the
    queue itself, never of what exceeds a batch."""
    times = _sample_times(requests, WARMUP_SHARE * duration_s, duration_s)
    if duration_s <= 0:
        return 0.0, -math.inf, math.inf
    return trend(times, np.maximum(waiting(requests, times) - largest_launch(requests), 0))


def sustain(requests: pd.DataFrame, duration_s: float, slos: dict | None = None,
            ceiling_req_s: float | None = None, mu_req_s: float | None = None, arrival_cv2: float = 1.0) -> Verdict:
    """The verdict on one run's requests table (every planned request a row; times in s since t0);
    `ceiling_req_s`: the saturated rate's upper bound, above which no offered rate is sustained; `mu_req_s`:
    its estimate, for how long the queue needs to settle at this load (settle_time_s; `arrival_cv2`: the
    arrivals' squared coefficient of variation, 1 for Poisson, 1 / burstiness for gamma). A run that broke
    no rule is still undecided when fewer than MIN_JUDGED requests arrived after the warm-up, or when its
    queue needs longer than the run's judged window to settle."""
    n = len(requests)
    served = float((requests["status"] == RequestStatus.FINISHED).sum() / n) if n else 0.0
    slope, lo, hi = queue_trend(requests, duration_s) if n else (0.0, -math.inf, math.inf)
    arrivals = requests["arrival_time"].to_numpy(dtype="float64")
    offered = float(((arrivals >= 0) & (arrivals <= duration_s)).sum() / duration_s) if duration_s > 0 else None
    reasons = []
    if served < SERVED_MIN:
        reasons.append(f"served {served:.1%} < {SERVED_MIN:.0%}")
    if offered is not None and lo > GROWTH_SHARE * offered:
        reasons.append(f"queue grew by {slope:.2f} [{lo:.2f}, {hi:.2f}] requests/s (limit {GROWTH_SHARE:.0%} of "
                       f"the {offered:.3g} req/s offered)")
    if ceiling_req_s is not None and offered is not None and offered > ceiling_req_s:
        reasons.append(f"offered {offered:.3g} req/s > the saturated rate's upper bound {ceiling_req_s:.3g}")
    elif ceiling_req_s is None and (kept := kept_up(requests, duration_s)) is not None \
            and kept[0] < (1 - GROWTH_SHARE) * kept[1]:
        reasons.append(f"completed {kept[0]:.3g} req/s at most during the traffic (95% bound), below the "
                       f"{kept[1]:.3g} req/s that arrived meanwhile")
    share = goodput(requests, slos)["fraction"] if slos and n else None
    if share is not None and share < GOODPUT_MIN:
        reasons.append(f"goodput {share:.1%} < {GOODPUT_MIN:.0%}")
    if reasons:
        return Verdict(False, reasons, served, slope, share, offered, lo, hi)
    doubt = undecided(arrivals, duration_s, offered, mu_req_s, arrival_cv2, largest_launch(requests) if n else 0)
    return Verdict(not doubt, doubt, served, slope, share, offered, lo, hi, judged=not doubt)


def undecided(arrivals: np.ndarray, duration_s: float, offered: float | None, mu_req_s: float | None,
              arrival_cv2: float, largest_launch_rows: int = 0) -> list[str]:
    """Why a run that broke no rule still cannot say it sustained its rate ([] when it can)."""
    judged_s = (1 - WARMUP_SHARE) * duration_s
    n = int(((arrivals >= WARMUP_SHARE * duration_s) & (arrivals <= duration_s)).sum())
    needed = max(MIN_JUDGED, 2 * largest_launch_rows)
    if n < needed:
        return [f"too few requests to judge ({n} arrived after the warm-up; {needed} needed)"]
    if mu_req_s and offered and (settle := settle_time_s(offered, mu_req_s, arrival_cv2)) * SETTLE_TIMES > judged_s:
        return [f"undecided: at ρ = {offered / mu_req_s:.2f} the queue needs about {settle:.3g} s to settle, and "
                f"{judged_s:.3g} s judged holds fewer than {SETTLE_TIMES:g} of that (a longer run could still find "
                "it overloaded)"]
    return []


def kept_up(requests: pd.DataFrame, duration_s: float) -> tuple[float, float] | None:
    """(the upper bound of the steady completion rate during the traffic, the arrival rate over the same
    window), by stats.saturation's window and interval; None when too few requests completed there to
    tell. With no saturated rate to compare against (a grid of fixed rates), a worker completing clearly less
    than arrived is overloaded however short the run."""
    from batchlab.stats.saturation import saturated_run

    run = saturated_run(requests, duration_s)
    if run is None or not math.isfinite(run.req_s_hi):
        return None
    start, end = run.window_s
    sub = requests[submitted_mask(requests) & requests["arrival_time"].notna()]
    admitted = _leave_times(sub) > sub["arrival_time"].to_numpy(dtype="float64")  # not refused on arrival
    arrived = sub["arrival_time"].to_numpy(dtype="float64")[admitted]
    return run.req_s_hi, float(((arrived >= start) & (arrived <= end)).sum() / (end - start))


def arrival_cv2(arrival: str, burstiness: float = 1.0) -> float:
    """The arrivals' squared coefficient of variation: Poisson 1, gamma 1 / burstiness, constant 0 (a trace's
    taken as Poisson's)."""
    return {"constant": 0.0, "gamma": 1.0 / burstiness}.get(arrival, 1.0)
