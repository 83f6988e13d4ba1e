"""Text the report's (and benchmarks') tables share: milliseconds, a figure, a Markdown table, a latency's p50 / p99."""
import math


def ms(value: float | None, missing: str = "—", unit: str = "") -> str:
    """Seconds → milliseconds text (`missing` when there is none)."""
    return missing if value is None else f"{value * 1e3:.1f}{unit}"


def figure(value: float | None, spec: str, missing: str = "-") -> str:
    """A rate, a throughput or a share as text, `missing` where there is none (None or NaN)."""
    return missing if value is None or math.isnan(value) else format(value, spec)


def sig3(value: float | None) -> str:
    """A figure to 3 significant digits, "-" for None (NaN shows as nan): the benchmarks' tables."""
    return "-" if value is None else f"{value:.3g}"


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the head, its rule, then one line per row."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def p50_p99(latency: dict, metric: str, missing: str) -> str:
    """'12.3 / 45.6': a metric's p50 and p99 in ms."""
    return f"{ms(latency[metric]['p50'], missing)} / {ms(latency[metric]['p99'], missing)}"
