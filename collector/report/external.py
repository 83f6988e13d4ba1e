"""Other tools' result files beside batchlab's strategies: `vllm bench serve --save-result` JSON.

A file is one external point: its label (vLLM's `label`, else backend and model, and the file's name),
its request rate (vLLM writes "inf" as text), its output throughput and its latencies, in seconds like
batchlab's figures. The report draws them as marked points and lists them in their own table.
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from batchlab.collector.report.points import ReportError

# batchlab's metric → vLLM's key stem; a percentile q → vLLM's key prefix (p50 is also its median)
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
QUANTILES = {"mean": "mean", "p50": "median", "p90": "p90", "p99": "p99"}
REQUIRED = ("request_throughput", "output_throughput")
KIND = "vllm bench serve"


@dataclass(slots=True)
class ExternalPoint:
    """One external tool's run, in batchlab's units (s, per s)."""

    label: str
    source: Path
    kind: str  # the tool, e.g. "vllm bench serve"
    rate: float  # requests/s asked for (inf: all at once)
    throughput_tok_s: float
    requests_per_s: float
    completed: int
    failed: int
    latency: dict  # metric -> {mean, p50, p90, p99} s (None where the file has no such key)

    @property
    def failed_share(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0


def is_vllm_result(data: object) -> bool:
    """A `vllm bench serve` result (and no batchlab run's own vllm_result.json)."""
    return (isinstance(data, dict) and all(k in data for k in REQUIRED) and "median_ttft_ms" in data
            and "batchlab_definitions" not in data)


def _rate(value: object) -> float:
    try:
        return float(value)  # "inf" reads as inf
    except (TypeError, ValueError):
        return math.nan


def _seconds(data: dict, metric: str, q: str) -> float | None:
    """One latency figure in s (vLLM writes ms), None when the file lacks it (p50: median_, else p50_)."""
    stem = METRICS[metric]
    value = data.get(f"{QUANTILES[q]}_{stem}_ms")
    value = data.get(f"p50_{stem}_ms") if value is None and q == "p50" else value
    return float(value) / 1e3 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def vllm_point(path: Path, data: dict) -> ExternalPoint:
    """The point of one vLLM result."""
    name = data.get("label") or f"{data.get('backend') or 'vllm'} {data.get('model_id') or ''}".strip()
    latency = {m: {q: _seconds(data, m, q) for q in QUANTILES} for m in METRICS}
    return ExternalPoint(f"{name} [{path.stem}]", path, KIND, _rate(data.get("request_rate")),
                         float(data["output_throughput"]), float(data["request_throughput"]),
                         int(data.get("completed") or 0), int(data.get("failed") or 0), latency)


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"--extra {path}: cannot read it as JSON ({exc})") from None


def load_external(folder: str | Path, files: list[str] | None = None) -> list[ExternalPoint]:
    """The files given (each must be a vLLM result: ReportError otherwise), then the vLLM results among the
    JSON files directly in `folder` (others are left alone), by rate then label."""
    given = [Path(f) for f in files or []]
    points = []
    for path in given:
        data = _read(path)
        if not is_vllm_result(data):
            raise ReportError(f"--extra {path}: not a vllm bench serve result (needs {', '.join(REQUIRED)}, "
                              "median_ttft_ms)")
        points.append(vllm_point(path, data))
    resolved = {p.resolve() for p in given}
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        if path.resolve() in resolved:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if is_vllm_result(data):
            points.append(vllm_point(path, data))
    return sorted(points, key=lambda p: (p.rate if not math.isnan(p.rate) else math.inf, p.label))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def section(points: list[ExternalPoint]) -> list[str]:
    """REPORT.md lines: the external points' table ([] when there are none)."""
    if not points:
        return []
    out = ["", "## Other tools' runs", "",
           f"Result files of other tools, drawn as stars in the latency plot. Their figures are the tool's "
           "own definitions (vLLM: TTFT from sending, TPOT per request, ITL between streamed chunks, duration "
           "the benchmark's wall time); latencies in ms as p50 / p99.", "",
           "| run | tool | rate req/s | completed | failed | req/s | out tok/s | TTFT | TPOT | ITL | E2E |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        lat = [f"{_ms(p.latency[m]['p50'])} / {_ms(p.latency[m]['p99'])}" for m in METRICS]
        out.append(f"| {p.label} | {p.kind} | {p.rate:g} | {p.completed} | {p.failed} | {p.requests_per_s:.2f} "
                   f"| {p.throughput_tok_s:.0f} | " + " | ".join(lat) + " |")
    return out
