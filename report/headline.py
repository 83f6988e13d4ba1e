"""The result in sentences, each strategy against naive batching, by a rule fixed in advance (RULE, below and in
REPORT.md; μ from capacity.json's `saturated` runs, latency pairs from report.stats.paired_latency). With one
repeat the estimate stands alone and the sentence says run-to-run variation was not measured. A change whose
interval includes zero reads as no significant difference."""
from dataclasses import dataclass

from batchlab.report.capacities import bracket_text, contradicts, mu_text
from batchlab.report.points import Collection
from batchlab.report.stats import paired_latency
from batchlab.stats.intervals import UNMEASURED, PairedResult, between_repeats, describe, pct_text

BASELINE = "naive"
NAMES = {"dynamic": "Dynamic batching", "continuous": "Continuous batching",
         "vllm": "vLLM (continuous batching)", "naive": "naive batching"}
COMMON_LOAD_SHARE = 0.8  # the latency comparison's load: at most this share of the lower capacity
NO_COMMON_RATE = (f"no grid rate at or below {COMMON_LOAD_SHARE:g} × the lower capacity, nor one both served "
                  "fully with a flat queue, was measured for both")
FALLBACK = "the lowest grid rate both served fully with a flat queue"
RULE = ("throughput = each strategy's saturated throughput μ (completions per second while the worker is kept "
        "busy) against naive batching's, paired by repeat (where no saturated run exists: the capacities); "
        "latency = TTFT p50 and E2E p50, paired over the same requests within each repeat, at the highest grid "
        f"rate ≤ {COMMON_LOAD_SHARE:g} × the lower of the two capacities, or, where a capacity is missing or "
        f"below a rate its own grid sustained or no grid rate qualifies, at {FALLBACK}; intervals from the spread "
        "between repeats (Student's t on the per-repeat log ratios)")


@dataclass(slots=True)
class Headline:
    """One strategy against the baseline: the throughput change, the common load and the paired latencies."""

    label: str
    capacity: PairedResult | None  # percent change of capacity, interval from the two brackets
    rate: float | None  # the common load (req/s); None: no grid rate qualifies
    ttft: PairedResult | None
    e2e: PairedResult | None
    text: str
    throughput: PairedResult | None = None  # percent change of the saturated μ, repeats as units (None: no runs)
    basis: str = ""  # why the common load is the rate it is ("" for the rule's first choice: ≤ 0.8 × capacity)


def saturated_runs(c: dict) -> dict[int, float]:
    """repeat → saturated completion rate (req/s) from a capacity entry's `saturated` runs ({} when none)."""
    runs = (c.get("saturated") or {}).get("runs") or []
    return {int(r["repeat"]): float(r["req_s"]) for r in runs if r.get("req_s")}


def throughput_ratio(new: dict, old: dict) -> PairedResult | None:
    """new's saturated μ against old's in percent: the ratio μ_new,r ÷ μ_old,r of each repeat both ran is one
    unit (intervals.between_repeats); None unless some repeat has both."""
    a, b = saturated_runs(new), saturated_runs(old)
    shared = sorted(a.keys() & b.keys())
    return between_repeats([a[r] / b[r] for r in shared]) if shared else None


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


def common_rate(rates: list[float], new: dict, old: dict) -> tuple[float | None, str]:
    """(the latency comparison's load, why it is that one): the highest of `rates` at or below
    COMMON_LOAD_SHARE × the lower capacity; where a capacity is missing, or below a grid rate its own sweep
    sustained (`grid_sustained`, report.capacities), or no rate qualifies: the lowest of `rates` that both
    sustained, saying why ((None, "") when there is none)."""
    points = [load_point(new), load_point(old)]
    doubt = [f"{c.get('label', lb)}'s capacity {why}" for lb, c, point in (("", new, points[0]), (BASELINE, old, points[1]))
             for why in [_doubt(c, point)] if why]
    if not doubt:
        fitting = [r for r in rates if r <= COMMON_LOAD_SHARE * min(points)]
        if fitting:
            return max(fitting), ""
        doubt = [f"no grid rate was at or below {COMMON_LOAD_SHARE:g} × the lower capacity"]
    held = [{g["rate"] for g in c.get("grid_sustained") or []} for c in (new, old)]
    both = sorted(set(rates) & held[0] & held[1])
    return (both[0], f"{FALLBACK}: {'; '.join(doubt)}") if both else (None, "")


def _doubt(c: dict, point: float | None) -> str:
    """Why a capacity cannot place the common load ('' when it can): none, or one below a rate its own grid
    sustained (report.capacities.contradicts, in offered rates)."""
    if not point:
        return "was not measured"
    held = [g for g in c.get("grid_sustained") or [] if contradicts(point, g["offered_req_s"])]
    return f"is below λ = {max(g['rate'] for g in held):g}, which its grid sustained" if held else ""


def capacity_sentence(label: str, new: dict, old: dict, ratio: PairedResult | None, hardware: str) -> str:
    """Without saturated runs: 'Dynamic batching raised capacity by +X% [a, b] (naive A [..] → dynamic B [..]
    req/s) …', saying that throughput was not measured at saturation."""
    name = NAMES.get(label, label)
    both = f"{BASELINE} {bracket_text(old)} → {label} {bracket_text(new)} req/s"
    if ratio is None:
        return (f"{name}: no saturated throughput measured, and capacity not compared to naive batching, a bracket "
                f"is open ({both}) on {hardware}.")
    if not ratio.significant:
        return (f"{name}: no saturated throughput measured; no significant difference in capacity from naive "
                f"batching (the brackets overlap: {both}) on {hardware}.")
    verb = "raised" if ratio.estimate > 0 else "lowered"
    return (f"{name}: no saturated throughput measured; it {verb} capacity (the highest arrival rate sustained) "
            f"by {pct_text(ratio)} ({both}) compared to naive batching on {hardware}.")


def change(result: PairedResult | None, what: str, up: str, down: str) -> str:
    """'improved throughput by +X% [a, b]', 'made no significant difference in …', or, with one repeat,
    'changed … by +X% (one repeat: run-to-run variation not measured)'."""
    if result is None:
        return f"could not be compared in {what}"
    if not result.measured:
        return f"changed {what} by {pct_text(result)}"
    if not result.significant:
        return f"made no significant difference in {what} ({pct_text(result)})"
    return f"{up if result.estimate > 0 else down} {what} by {pct_text(result)}"


def headline_text(label: str, new: dict, old: dict, found: "Headline", hardware: str) -> str:
    """'Dynamic batching improved throughput by … and reduced TTFT p50 by … compared to naive batching at λ =
    R req/s on HW.' then how each figure was measured."""
    name, thr, rate = NAMES.get(label, label), found.throughput, found.rate
    if rate is None:
        latency, where = f"; latency not compared ({NO_COMMON_RATE})", ""
    else:
        latency = (f" and {change(found.ttft, 'TTFT p50', 'raised', 'reduced')} "
                   f"({describe(found.e2e, 'E2E p50')})")
        where = f" at λ = {rate:g} req/s"
    text = (f"{name} {change(thr, 'throughput', 'improved', 'lowered')}{latency} compared to naive batching"
            f"{where} on {hardware}.")
    single = [what for what, r in (("throughput", thr), ("TTFT p50", found.ttft), ("E2E p50", found.e2e))
              if r is not None and not r.measured]
    if single:  # said once, not after every figure
        figures = ", ".join(single)
        text = text.replace(f" ({UNMEASURED})", "") + (f" {figures[0].upper()}{figures[1:]} from one repeat: "
                                                       f"{UNMEASURED[12:]}, so no difference there is called significant.")
    text += (f" Throughput: saturated μ, {BASELINE} {mu_text(old.get('saturated'))} → {label} "
             f"{mu_text(new.get('saturated'))} req/s, {thr.clusters} paired repeat(s).")
    if found.ttft is not None:
        text += (f" Latency at λ = {rate:g} req/s ({load_basis(found.basis)}), paired over "
                 f"{found.ttft.n_pairs} requests in {found.ttft.clusters} repeat(s).")
    return text


def load_basis(basis: str) -> str:
    """Why the common load is what it is, for a sentence."""
    return basis or f"≤ {COMMON_LOAD_SHARE:g} × the lower capacity"


def headline(collection: Collection, capacities: dict[str, dict], label: str, hardware: str,
             baseline: str = BASELINE) -> Headline:
    """The rule applied to one strategy against the baseline."""
    new, old = capacities[label], capacities[baseline]
    shared = sorted(set(r.rate for r in collection.runs if r.label == label)
                    & set(r.rate for r in collection.runs if r.label == baseline))
    rate, basis = common_rate(shared, {"label": label, **new}, old)
    ttft = e2e = None
    if rate is not None:
        runs_a, runs_b = collection.group(label, rate), collection.group(baseline, rate)
        ttft, e2e = paired_latency(runs_a, runs_b, "ttft", 50), paired_latency(runs_a, runs_b, "e2e", 50)
    found = Headline(label, capacity_ratio(new, old), rate, ttft, e2e, "", throughput_ratio(new, old), basis)
    if found.throughput is not None:
        found.text = headline_text(label, new, old, found, hardware)
    else:  # an older capacity.json, a fixed-rate sweep: capacity is the throughput figure there is
        found.text = (capacity_sentence(label, new, old, found.capacity, hardware)
                      + latency_sentence(rate, ttft, e2e, basis))
    return found


def latency_sentence(rate: float | None, ttft: PairedResult | None, e2e: PairedResult | None,
                     basis: str = "") -> str:
    """' At λ = R req/s (…), against naive batching: TTFT p50 … ; E2E p50 … (paired over N requests).'"""
    if rate is None:
        return f" Latency not compared: {NO_COMMON_RATE}."
    pairs = f" (paired over {ttft.n_pairs} requests in {ttft.clusters} repeat(s))" if ttft else ""
    return (f" At λ = {rate:g} req/s ({load_basis(basis)}), against naive batching: "
            f"{describe(ttft, 'TTFT p50')}; {describe(e2e, 'E2E p50')}{pairs}.")


def headlines(collection: Collection, capacities: dict[str, dict], hardware_of: dict[str, str],
              baseline: str = BASELINE) -> list[Headline]:
    """One per strategy measured beside the baseline (dynamic first); none without the baseline."""
    if baseline not in capacities:
        return []
    ordered = sorted((lb for lb in capacities if lb != baseline), key=lambda lb: lb != "dynamic")
    return [headline(collection, capacities, lb, hardware_of.get(lb, "this machine"), baseline) for lb in ordered]
