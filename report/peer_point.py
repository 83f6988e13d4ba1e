"""One run of another benchmark tool in batchlab's terms (report.external reads them): its latencies in the
columns of batchlab's metric of the same definition, each under the tool's own name where that differs, and
every figure the tool's console prints, with its value, as the tool names it."""
import math
from dataclasses import dataclass, field
from pathlib import Path

POINT_METRICS = ("ttft", "tpot", "itl", "e2e")  # batchlab's latency names, in the report's column order
POINT_QUANTILES = ("mean", "p50", "p90", "p95", "p99")  # p95: GuideLLM's console prints it


@dataclass(slots=True)
class Figure:
    """One figure a tool's console prints, as it prints it: its name (the console's row or column), its unit
    and its statistics (statistic name → value in that unit; None where the file has none)."""

    name: str
    unit: str
    values: dict[str, float | str | None]  # str: a time the console prints as a time


@dataclass(slots=True)
class ExternalPoint:
    """One external tool's run, in batchlab's units (s, per s); NaN or None where the file has no figure."""

    head: str  # the label before its file, e.g. "guidellm: constant @ 2 req/s"
    source: Path
    kind: str  # the tool, e.g. "vllm bench serve"
    rate: float  # requests/s asked for (inf: all at once; NaN: the tool set no rate, e.g. a concurrency)
    throughput_tok_s: float  # output tokens/s as the tool measured it
    requests_per_s: float  # finished requests/s as the tool measured it
    completed: int
    failed: int
    latency: dict  # batchlab metric -> {mean, p50, p90, p95, p99} s of the tool's metric of the same definition
    incomplete: int | None = None  # requests still in flight at the tool's cut-off (None: it counts none)
    names: dict[str, str] = field(default_factory=dict)  # batchlab metric -> the tool's name, where it differs
    load: str = ""  # the load as the tool set it (rate, arrivals, cap on requests in flight, requests)
    figures: list[Figure] = field(default_factory=list)  # every figure its console prints, in its order
    warnings: list[str] = field(default_factory=list)  # the tool's own warnings about this run
    unplaced: tuple[str, ...] = ()  # the file's figures shown nowhere in the report, named there
    not_finite: tuple[str, ...] = ()  # the file's fields holding inf or NaN where a figure belongs (shown as '-')
    where: str = ""  # which part of the file (e.g. "line 2"), when a file holds several runs
    label: str = ""  # unique among the report's points (report.external.unique_labels)

    @property
    def failed_share(self) -> float:
        """Failed ÷ (completed + failed) (0 when neither)."""
        total = self.completed + self.failed
        return self.failed / total if total else 0.0


def number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (absent, text, bool, NaN, ±inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)  # an int of 10**400 digits is no float
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


ENDLESS_OK = frozenset({"request_rate", "rate", "burstiness"})  # +inf means something here: all at once, constant
NOT_FINITE_SHOWN = 10  # a file's non-finite fields named at most; the rest counted


def not_finite(data: object, path: str = "") -> list[str]:
    """Every field of a file's JSON holding a non-finite number ('mean_ttft_ms = inf', 'benchmarks[0].metrics.
    ...median = nan'), but for a rate or burstiness of +inf (all at once, constant spacing)."""
    if isinstance(data, dict):
        return [f for k, v in data.items() for f in not_finite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(data, list):
        return [f for i, v in enumerate(data) for f in
                (not_finite(v[1], f"line {v[0]}") if isinstance(v, tuple) else not_finite(v, f"{path}[{i}]"))]
    if isinstance(data, float) and not math.isfinite(data):
        key = path.rpartition(".")[2]
        return [] if data == math.inf and key in ENDLESS_OK else [f"{path} = {data}"]
    return []


def not_finite_lines(data: object) -> tuple[str, ...]:
    """not_finite's fields, at most NOT_FINITE_SHOWN named and the rest counted."""
    found = not_finite(data)
    more = len(found) - NOT_FINITE_SHOWN
    return tuple(found[:NOT_FINITE_SHOWN]) + ((f"and {more} more",) if more > 0 else ())


def count(value: object, what: str) -> int:
    """A request count of a file: a finite number ≥ 0 (absent: 0); ValueError naming it otherwise."""
    if value is None:
        return 0
    found = number(value)
    if found is None or found < 0 or found != int(found):
        raise ValueError(f"{what} is {value!r}, not a count")
    return int(found)


def empty_latency() -> dict:
    """Every metric and quantile left empty."""
    return {m: dict.fromkeys(POINT_QUANTILES) for m in POINT_METRICS}


def as_dict(value: object) -> dict:
    """A JSON object as it is; {} for anything else (absent, a list, a number)."""
    return value if isinstance(value, dict) else {}
