"""The search over arrival rates for a strategy's capacity: which rate to measure next (up geometrically while the
bracket is open, then bisecting in log space until hi / lo ≤ 1 + width or max_probes), and the loop that measures
them. Pure: it calls a `measure(rate)` it is given (a live point, or a simulated one: lab/capacity_search.py) and
opens nothing itself; stats/verdict.py judges each probe and stats/capacity.py brackets them."""
import math
from collections.abc import Callable

from batchlab.protocol.study_settings import MAX_PROBES, WIDTH  # the search's defaults, declared with its knobs
from batchlab.stats.capacity import CapacityEstimate, Probe, bracket, capacity_of

GROW_FACTOR = 1.5  # rate step while the bracket is open on one side


def _rounded(rate: float) -> float:
    return float(f"{rate:.3g}")


def next_rate(probes: list[Probe], start_req_s: float, *, width: float = WIDTH, max_probes: int = MAX_PROBES,
              factor: float = GROW_FACTOR, ceiling: float | None = None) -> float | None:
    """The next rate to measure, or None when the bracket is narrow enough or the probes are spent."""
    if len(probes) >= max_probes:
        return None
    if not probes:
        return _rounded(start_req_s)
    lo, hi = bracket(probes, ceiling)
    if hi is None:
        return _rounded(lo * factor)
    if lo is None and ceiling and hi < min(p.rate_req_s for p in probes):
        return _rounded(hi / math.sqrt(1 + width))  # only above μ failed: start again just below it
    if lo is None:
        return _rounded(hi / factor)
    if hi / lo <= 1 + width:
        return None
    rate = _rounded(math.sqrt(lo * hi))
    return rate if lo < rate < hi else None  # 3 significant digits leave nothing between them


Measure = Callable[[float], Probe]


def search(label: str, start_req_s: float, measure: Measure, *, width: float = WIDTH, max_probes: int = MAX_PROBES,
           factor: float = GROW_FACTOR, saturated: dict | None = None) -> CapacityEstimate:
    """Measure rates from start_req_s on until next_rate says stop; the bracket they give (closed above by
    μ's upper bound when `saturated` gives it: measure's verdicts should use the same ceiling)."""
    if not start_req_s > 0:
        raise ValueError(f"a capacity search needs a positive start rate, got {start_req_s}")
    ceiling = saturated["req_s_hi"] if saturated else None
    probes: list[Probe] = []
    while (rate := next_rate(probes, start_req_s, width=width, max_probes=max_probes, factor=factor,
                             ceiling=ceiling)) is not None:
        probes.append(measure(rate))
    return capacity_of(label, probes, start_req_s, saturated)


def start_below(saturated: dict, width: float = WIDTH) -> float:
    """The first probe's rate: μ ÷ √(1 + width), so that, sustained, it closes the bracket with μ's bound."""
    return saturated["req_s"] / math.sqrt(1 + width)
