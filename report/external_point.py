"""One other tool's run as the report places it: an external point, in batchlab's units."""
import math
from dataclasses import dataclass
from pathlib import Path

METRICS = ("ttft", "tpot", "itl", "e2e")  # batchlab's latency names, in the report's column order
QUANTILES = ("mean", "p50", "p90", "p95", "p99")  # p95: GuideLLM's console prints it


@dataclass(slots=True)
class ExternalPoint:
    """One external tool's run, in batchlab's units (s, per s); NaN or None where the file has no figure."""

    label: str
    source: Path
    kind: str  # the tool, e.g. "vllm bench serve"
    rate: float  # requests/s asked for (inf: all at once; NaN: the tool set no rate, e.g. a concurrency)
    throughput_tok_s: float  # output tokens/s as the tool measured it
    requests_per_s: float  # finished requests/s as the tool measured it
    completed: int
    failed: int
    latency: dict  # metric -> {mean, p50, p90, p95, p99} s (None where the file has no such figure)
    incomplete: int | None = None  # requests still in flight at the tool's cut-off (None: it counts none)
    unplaced: tuple[str, ...] = ()  # the file's figures batchlab has no place for, named in the report

    @property
    def failed_share(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0


def number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (absent, text, bool, NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def empty_latency() -> dict:
    """Every metric and quantile left empty."""
    return {m: dict.fromkeys(QUANTILES) for m in METRICS}


def figure(value: float | None, spec: str) -> str:
    """A rate or a throughput as text, '-' where the file has none (NaN)."""
    return "-" if value is None or math.isnan(value) else format(value, spec)
