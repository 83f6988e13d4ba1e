"""The one-line result in the seed's form, with honest signs, for each strategy against naive, stated at
a rate a fixed rule picks (RULE), never at the rate where the result looks best."""
from dataclasses import dataclass

from batchlab.collector.report.stats import GroupStats

BASELINE = "naive"
NAMES = {"dynamic": "Dynamic batching", "continuous": "Continuous batching",
         "vllm": "vLLM (continuous batching)", "naive": "naive batching"}
LATENCY = ("ttft", "p50")  # the latency the line's Y is about; E2E p50 is given beside it
MIN_FINISHED_SHARE = 0.99  # a rate where either side dropped more than 1% is not a fair comparison
RULE = (f"the highest rate at which both finished ≥ {MIN_FINISHED_SHARE:.0%} of the requests they scheduled "
        "(over the repeats at that rate)")


@dataclass(slots=True)
class Comparison:
    """One strategy against the baseline at one rate (percent changes, + means larger)."""

    label: str
    rate: float
    throughput_pct: float
    ttft_p50_pct: float
    e2e_p50_pct: float


def _pct(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (new / old - 1.0) * 100.0


def _completed(stats: dict, label: str) -> set[float]:
    return {rate for (lb, rate), g in stats.items()
            if lb == label and g.scheduled - g.failed > 0 and g.latency["ttft"]["p50"] is not None}


def _at(stats: dict, label: str, baseline: str, rate: float) -> Comparison | None:
    new, old = stats[(label, rate)], stats[(baseline, rate)]
    pcts = [_pct(new.throughput_tok_s, old.throughput_tok_s),
            _pct(new.latency["ttft"]["p50"], old.latency["ttft"]["p50"]),
            _pct(new.latency["e2e"]["p50"], old.latency["e2e"]["p50"])]
    return None if any(p is None for p in pcts) else Comparison(label, rate, *pcts)


def comparisons(stats: dict[tuple[str, float], GroupStats], label: str,
                baseline: str = BASELINE) -> list[Comparison]:
    """The strategy against the baseline at every rate both completed, lowest rate first."""
    common = _completed(stats, label) & _completed(stats, baseline)
    return [c for rate in sorted(common) if (c := _at(stats, label, baseline, rate)) is not None]


def qualifies(stats: dict[tuple[str, float], GroupStats], label: str, baseline: str, rate: float) -> bool:
    """Both finished at least MIN_FINISHED_SHARE of what they scheduled at this rate."""
    return all(stats[(lb, rate)].finished_share >= MIN_FINISHED_SHARE for lb in (label, baseline))


def compare(stats: dict[tuple[str, float], GroupStats], label: str,
            baseline: str = BASELINE) -> Comparison | None:
    """At the rate RULE fixes in advance: the highest rate where both finished ≥ 99% of their requests.
    A fixed rule, not the rate where the result looks best; None when no rate qualifies."""
    good = [c for c in comparisons(stats, label, baseline) if qualifies(stats, label, baseline, c.rate)]
    return good[-1] if good else None


def signed(pct: float) -> str:
    """+12.3% or −4.5% (a true minus sign, as in the seed)."""
    return f"+{pct:.1f}%" if pct >= 0 else f"−{abs(pct):.1f}%"


def sentence(c: Comparison, hardware: str) -> str:
    """'Dynamic batching improved throughput by +X% and reduced latency by −Y% compared to …'."""
    name = NAMES.get(c.label, c.label)
    thr = (f"improved throughput by {signed(c.throughput_pct)}" if c.throughput_pct >= 0
           else f"changed throughput by {signed(c.throughput_pct)}")
    lat = (f"reduced latency by {signed(c.ttft_p50_pct)}" if c.ttft_p50_pct <= 0
           else f"increased latency by {signed(c.ttft_p50_pct)}")
    return (f"{name} {thr} and {lat} compared to naive batching at λ = {c.rate:g} req/s on {hardware}. "
            f"Throughput = output tokens/s; latency = TTFT p50; E2E p50 changed by {signed(c.e2e_p50_pct)}.")


def _failed(stats: dict[tuple[str, float], GroupStats], c: Comparison, baseline: str) -> str:
    return ", ".join(f"{lb} {stats[(lb, c.rate)].failed_text()}" for lb in (c.label, baseline))


def at_highest(c: Comparison, highest: Comparison, stats: dict[tuple[str, float], GroupStats],
               baseline: str = BASELINE) -> str:
    """The same comparison at the highest rate measured, with its failed shares, when it is another rate."""
    if highest.rate == c.rate:
        return ""
    return (f" At the highest rate, λ = {highest.rate:g} req/s: throughput {signed(highest.throughput_pct)}, "
            f"TTFT p50 {signed(highest.ttft_p50_pct)}; failed: {_failed(stats, highest, baseline)}.")


def no_rate_qualifies(label: str) -> str:
    """The one sentence in place of a headline when no rate passes the rule."""
    return (f"{NAMES.get(label, label)} is not compared to naive batching: no rate qualifies under the "
            f"fixed rule ({RULE}).")


def headlines(stats: dict[tuple[str, float], GroupStats], labels: list[str],
              hardware_of: dict[str, str]) -> list[str]:
    """One sentence per non-naive strategy measured beside naive (dynamic first); none without naive."""
    ordered = sorted((lb for lb in labels if lb != BASELINE), key=lambda lb: lb != "dynamic")
    lines = []
    for label in ordered:
        every = comparisons(stats, label)
        if not every:
            continue
        c = compare(stats, label)
        lines.append(no_rate_qualifies(label) if c is None else
                     sentence(c, hardware_of.get(label, "this machine")) + at_highest(c, every[-1], stats))
    return lines
