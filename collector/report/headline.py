"""The result in sentences, each strategy against naive batching, by a rule fixed in advance (RULE):
throughput is the ratio of the capacities; latency is TTFT p50 and E2E p50 at a common load both sustain,
paired over the same requests (collector.report.stats.paired_latency). Every number carries its interval
or bracket, and a change whose interval includes zero is written as no significant difference."""
from dataclasses import dataclass

from batchlab.collector.report.capacities import bracket_text
from batchlab.collector.report.intervals import PairedResult, describe, pct_text
from batchlab.collector.report.points import Collection
from batchlab.collector.report.stats import paired_latency

BASELINE = "naive"
NAMES = {"dynamic": "Dynamic batching", "continuous": "Continuous batching",
         "vllm": "vLLM (continuous batching)", "naive": "naive batching"}
COMMON_LOAD_SHARE = 0.8  # the latency comparison's load: at most this share of the lower capacity
RULE = ("throughput = each strategy's capacity (the highest arrival rate it sustains) against naive batching's; "
        "latency = TTFT p50 and E2E p50, paired over the same requests, at the highest grid rate ≤ "
        f"{COMMON_LOAD_SHARE:g} × the lower of the two capacities")


@dataclass(slots=True)
class Headline:
    """One strategy against the baseline: the capacity change, the common load and the paired latencies."""

    label: str
    capacity: PairedResult | None  # percent change of capacity, interval from the two brackets
    rate: float | None  # the common load (req/s); None: no grid rate qualifies
    ttft: PairedResult | None
    e2e: PairedResult | None
    text: str


def capacity_ratio(new: dict, old: dict) -> PairedResult | None:
    """new's capacity against old's in percent: estimate ÷ estimate − 1, interval from the brackets
    [lo_new ÷ hi_old − 1, hi_new ÷ lo_old − 1]; None unless both brackets are closed."""
    if not all(c.get(k) for c in (new, old) for k in ("lo_req_s", "hi_req_s")):
        return None
    est = new["estimate_req_s"] / old["estimate_req_s"] - 1
    lo, hi = new["lo_req_s"] / old["hi_req_s"] - 1, new["hi_req_s"] / old["lo_req_s"] - 1
    return PairedResult(est * 100, lo * 100, hi * 100, 0, not lo <= 0 <= hi)


def load_point(c: dict) -> float | None:
    """The rate a capacity vouches for: its estimate, else the highest rate sustained (a floor)."""
    return c.get("estimate_req_s") or c.get("lo_req_s")


def common_rate(rates: list[float], new: dict, old: dict) -> float | None:
    """The highest of `rates` at or below COMMON_LOAD_SHARE × the lower capacity (None: none, or unknown)."""
    points = [load_point(new), load_point(old)]
    if not all(points):
        return None
    fitting = [r for r in rates if r <= COMMON_LOAD_SHARE * min(points)]
    return max(fitting) if fitting else None


def capacity_sentence(label: str, new: dict, old: dict, ratio: PairedResult | None, hardware: str) -> str:
    """'Dynamic batching raised capacity by +X% [a, b] (naive A [..] → dynamic B [..] req/s) on …'."""
    name = NAMES.get(label, label)
    both = f"{BASELINE} {bracket_text(old)} → {label} {bracket_text(new)} req/s"
    if ratio is None:
        return f"{name}: capacity not compared to naive batching, a bracket is open ({both}) on {hardware}."
    if not ratio.significant:
        return (f"{name}: no significant difference in capacity from naive batching (the brackets overlap: "
                f"{both}) on {hardware}.")
    verb = "raised" if ratio.estimate > 0 else "lowered"
    return f"{name} {verb} capacity by {pct_text(ratio)} ({both}) compared to naive batching on {hardware}."


def latency_sentence(rate: float | None, ttft: PairedResult | None, e2e: PairedResult | None) -> str:
    """' At λ = R req/s (…), against naive batching: TTFT p50 … ; E2E p50 … (paired over N requests).'"""
    if rate is None:
        return (f" Latency not compared: no grid rate at or below {COMMON_LOAD_SHARE:g} × the lower capacity "
                "was measured for both.")
    pairs = f" (paired over {ttft.n_pairs} requests, {ttft.clusters} repeat(s))" if ttft else ""
    return (f" At λ = {rate:g} req/s (≤ {COMMON_LOAD_SHARE:g} × the lower capacity), against naive batching: "
            f"{describe(ttft, 'TTFT p50')}; {describe(e2e, 'E2E p50')}{pairs}.")


def headline(collection: Collection, capacities: dict[str, dict], label: str, hardware: str,
             baseline: str = BASELINE) -> Headline:
    """The rule applied to one strategy against the baseline."""
    new, old = capacities[label], capacities[baseline]
    ratio = capacity_ratio(new, old)
    shared = sorted(set(r.rate for r in collection.runs if r.label == label)
                    & set(r.rate for r in collection.runs if r.label == baseline))
    rate = common_rate(shared, new, old)
    ttft = e2e = None
    if rate is not None:
        runs_a, runs_b = collection.group(label, rate), collection.group(baseline, rate)
        ttft, e2e = paired_latency(runs_a, runs_b, "ttft", 50), paired_latency(runs_a, runs_b, "e2e", 50)
    text = capacity_sentence(label, new, old, ratio, hardware) + latency_sentence(rate, ttft, e2e)
    return Headline(label, ratio, rate, ttft, e2e, text)


def headlines(collection: Collection, capacities: dict[str, dict], hardware_of: dict[str, str],
              baseline: str = BASELINE) -> list[Headline]:
    """One per strategy measured beside the baseline (dynamic first); none without the baseline."""
    if baseline not in capacities:
        return []
    ordered = sorted((lb for lb in capacities if lb != baseline), key=lambda lb: lb != "dynamic")
    return [headline(collection, capacities, lb, hardware_of.get(lb, "this machine"), baseline) for lb in ordered]
