"""A strategy's capacity from the verdicts of its probes: the bracket [highest rate sustained, lowest not], the
estimate in it and its interval, in the arrival rates the runs offered (docs/capacity.md, "The search"). Pure:
probes in, numbers out; lab/rate_search.py chooses the rates, stats/verdict.py judges each."""
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from batchlab.protocol.status import RequestStatus
from batchlab.stats.verdict import Verdict, sustain


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
class CapacityEstimate:
    """A strategy's capacity bracket [lo, hi] (offered req/s; None: open on that side), the probes behind it
    and the saturated rate μ that bounds it."""

    label: str
    lo_req_s: float | None
    hi_req_s: float | None  # the lowest rate not sustained, or μ's upper bound when that is lower
    probes: list[Probe] = field(default_factory=list)
    start_req_s: float | None = None
    note: str = ""  # why there is no bracket (the saturated run that places the first probe failed)
    saturated: dict | None = None  # stats.saturation.pooled: μ with its interval, and its runs
    undecided_req_s: float | None = None  # the lowest rate in the bracket a probe could not judge (offered)

    @property
    def estimate_req_s(self) -> float | None:
        """The geometric mean of the highest rate sustained and the lowest one not known to be (not sustained,
        undecided, or μ's bound), never above μ (None while the bracket is open)."""
        top = min(v for v in (self.hi_req_s, self.undecided_req_s) if v is not None) if self.hi_req_s else None
        if not (self.lo_req_s and top):
            return None
        return min(math.sqrt(self.lo_req_s * top), self.saturated["req_s"] if self.saturated else math.inf)

    @property
    def interval_req_s(self) -> tuple[float | None, float | None]:
        """(low, high): the bracket widened below by what the queue may still have been gaining at the highest
        rate judged sustained (its trend's upper bound: the verdict's own uncertainty), and down to the
        estimate when μ holds it below the bracket (a short probe judged a rate above μ's estimate sustained)."""
        lo_probe = next((p for p in self.probes if p.offered_req_s == self.lo_req_s and p.verdict.sustained), None)
        margin = max(lo_probe.verdict.queue_growth_hi, 0.0) if lo_probe else 0.0
        if self.lo_req_s is None:
            return None, self.hi_req_s
        return min(max(self.lo_req_s - margin, 0.0), self.estimate_req_s or math.inf), self.hi_req_s

    def tokens_per_request(self) -> float | None:
        """Mean output tokens per finished request over the probes (the same trace for every strategy)."""
        values = [p.tokens_per_request for p in self.probes if p.tokens_per_request]
        return float(np.mean(values)) if values else None

    def as_dict(self) -> dict:
        """capacity.json's entry: the estimate and its interval (lo, hi) in req/s and tok/s, the search's
        bracket, μ, and every probe."""
        tpr = self.tokens_per_request()
        lo, hi = self.interval_req_s
        tok = {f"{k}_tok_s": (v * tpr if v is not None and tpr else None)
               for k, v in (("lo", lo), ("hi", hi), ("estimate", self.estimate_req_s))}
        probes = [{"rate_req_s": p.rate_req_s, "folder": p.folder, "tokens_per_request": p.tokens_per_request,
                   **asdict(p.verdict)} for p in self.probes]
        return {"label": self.label, "lo_req_s": lo, "hi_req_s": hi, "estimate_req_s": self.estimate_req_s, **tok,
                "bracket_req_s": [self.lo_req_s, self.hi_req_s], "undecided_req_s": self.undecided_req_s,
                "tokens_per_request": tpr,
                "start_req_s": self.start_req_s, "saturated": self.saturated, "probes": probes,
                **({"note": self.note} if self.note else {})}


def bracket(probes: list[Probe], ceiling: float | None = None,
            judged_only: bool = False) -> tuple[float | None, float | None]:
    """(highest sustained nominal rate below the lowest one not known to be sustained, that lowest rate): a
    rate not sustained, or one a probe could not judge (with `judged_only`: only a rate judged not sustained,
    so an undecided rate neither bounds the bracket nor hides a sustained one above it); `ceiling`: an
    offered rate known not to be sustained without measuring it (μ's upper bound), taken to nominal by the
    probes' nominal ÷ offered (every probe replays the same schedule, scaled)."""
    doubtful = [p.rate_req_s for p in probes if (p.verdict.failed if judged_only else not p.verdict.sustained)]
    if ceiling:  # the nominal rate whose schedule offers it, as the probes' schedules did (1:1 before any)
        nominal_share = [p.rate_req_s / p.offered_req_s for p in probes]
        doubtful.append(ceiling * float(np.mean(nominal_share)) if probes else ceiling)
    top = min(doubtful, default=None)
    lo = max((p.rate_req_s for p in probes if p.verdict.sustained and (top is None or p.rate_req_s < top)),
             default=None)
    return lo, top


def capacity_of(label: str, probes: list[Probe], start_req_s: float | None = None,
                saturated: dict | None = None) -> CapacityEstimate:
    """The bracket of these probes in the rates they offered (every strategy replays the same schedule, so
    its arrivals are the same multiple of the nominal rate for all), closed above by μ's upper bound."""
    offered = {p.rate_req_s: p.offered_req_s for p in probes}
    lo, hi = bracket(probes, judged_only=True)
    ceiling = saturated["req_s_hi"] if saturated else None
    hi_offered = min((v for v in (offered.get(hi), ceiling) if v is not None), default=None)
    lo_offered = offered.get(lo)
    if lo_offered is not None and hi_offered is not None and lo_offered >= hi_offered:
        lo_offered = None  # sustained only above μ's bound: the verdict had no ceiling (grid rates, no μ)
    doubts = [p.offered_req_s for p in probes if not p.verdict.judged and (lo_offered is None or p.offered_req_s >
                                                                           lo_offered)
              and (hi_offered is None or p.offered_req_s < hi_offered)]
    return CapacityEstimate(label, lo_offered, hi_offered, probes, start_req_s, saturated=saturated,
                            undecided_req_s=min(doubts, default=None))


def tokens_per_request(requests: pd.DataFrame) -> float | None:
    """Mean output tokens of the finished requests (None when none finished)."""
    done = requests[requests["status"] == RequestStatus.FINISHED]
    return float(done["n_tokens"].mean()) if len(done) else None


def from_runs(label: str, runs: list[tuple[float, pd.DataFrame, float]],
              slos: dict | None = None) -> CapacityEstimate:
    """A bracket from fixed grid rates: (rate, requests table, duration_s) per run; a rate with several
    repeats is sustained only when every repeat is."""
    by_rate: dict[float, list[Probe]] = {}
    for rate, requests, duration_s in runs:
        by_rate.setdefault(rate, []).append(Probe(rate, sustain(requests, duration_s, slos),
                                                  tokens_per_request=tokens_per_request(requests)))
    probes = [next((p for p in ps if p.verdict.failed), next((p for p in ps if not p.verdict.judged), ps[0]))
              for _, ps in sorted(by_rate.items())]  # a failed repeat decides; else one that could not tell
    return capacity_of(label, probes)
