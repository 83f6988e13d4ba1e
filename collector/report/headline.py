"""The one-line result in the seed's form, with honest signs, for each strategy against naive."""
from dataclasses import dataclass

from collector.report.stats import GroupStats

BASELINE = "naive"
NAMES = {"dynamic": "Dynamic batching", "continuous": "Continuous batching",
         "vllm": "vLLM (continuous batching)", "naive": "naive batching"}
LATENCY = ("ttft", "p50")  # the latency the line's Y is about; E2E p50 is given beside it


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


def compare(stats: dict[tuple[str, float], GroupStats], label: str,
            baseline: str = BASELINE) -> Comparison | None:
    """At the most informative rate: where TTFT p50 differs most between the two (ties: higher rate).
    Below capacity every strategy serves the same throughput and batching shows in latency."""
    return max(comparisons(stats, label, baseline), key=lambda c: (abs(c.ttft_p50_pct), c.rate), default=None)


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


def at_highest(c: Comparison, highest: Comparison) -> str:
    """The same comparison at the highest rate, when the line's rate is another one."""
    if highest.rate == c.rate:
        return ""
    return (f" At the highest rate, λ = {highest.rate:g} req/s: throughput {signed(highest.throughput_pct)}, "
            f"TTFT p50 {signed(highest.ttft_p50_pct)}.")


def headlines(stats: dict[tuple[str, float], GroupStats], labels: list[str],
              hardware_of: dict[str, str]) -> list[str]:
    """One sentence per non-naive strategy (dynamic first); none when naive is absent."""
    ordered = sorted((lb for lb in labels if lb != BASELINE), key=lambda lb: lb != "dynamic")
    lines = []
    for label in ordered:
        c, every = compare(stats, label), comparisons(stats, label)
        if c is not None:
            lines.append(sentence(c, hardware_of.get(label, "this machine")) + at_highest(c, every[-1]))
    return lines
