"""Other tools' result files beside batchlab's strategies: `vllm bench serve --save-result` JSON, GuideLLM's
benchmarks.json and AIPerf's profile_export_aiperf.json, told apart by their content.

A vLLM file is one point; a GuideLLM report one point per benchmark (report.extra_formats); an
AIPerf export one point. Each carries its label, its offered request rate, its measured throughput and its
latencies, in seconds like batchlab's figures. The report draws them as marked points and lists them in
their own table, with the definitions that differ from batchlab's stated once per tool.
"""
import json
import math
import re
from pathlib import Path

from batchlab.report.external_point import METRICS as POINT_METRICS
from batchlab.report.external_point import QUANTILES as POINT_QUANTILES
from batchlab.report.external_point import ExternalPoint, figure
from batchlab.report.extra_formats import (AIPERF, GUIDELLM, aiperf_point, guidellm_points, is_aiperf,
                                                      is_guidellm)
from batchlab.report.points import ReportError
from batchlab.report.text import md_table, ms, p50_p99

__all__ = ["ExternalPoint", "load_external", "section"]

# batchlab's metric → vLLM's key stem; a percentile q → vLLM's key prefix (p50 is also its median)
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
QUANTILES = {"mean": "mean", "p50": "median", "p90": "p90", "p95": "p95", "p99": "p99"}
REQUIRED = ("request_throughput", "output_throughput")
# the numeric keys of a vLLM result that the point holds or that describe its setup (others are named as not
# placed): the counts, rates and the mean/median/p90/p99 of each metric (its std and other percentiles are not)
VLLM_PLACED = {*REQUIRED, "completed", "failed", "request_rate", "num_prompts", "burstiness", "max_concurrency"}
VLLM_SHOWN = re.compile(rf"(mean|median|p50|p90|p95|p99)_({'|'.join(METRICS.values())})_ms")
KIND = "vllm bench serve"
ACCEPTED = ("vllm bench serve --save-result JSON, GuideLLM's JSON report (guidellm run --output "
            "kind=json,path=FILE), AIPerf profile_export_aiperf.json")
# each tool's definitions where they differ from batchlab's (TTFT from arrival at the scheduler, TPOT
# (completion − first token) ÷ (tokens − 1) per request, ITL the gaps between consecutive tokens)
DEFINITIONS = {
    KIND: "TTFT from sending the request; TPOT per request, as batchlab's; ITL the gaps between streamed "
          "chunks (a chunk of k tokens is one gap, not k); rate the one asked for (inf: all at once)",
    GUIDELLM: "TTFT from sending the request; its ITL, (last − first token) ÷ (output tokens − 1) per request, "
              "is batchlab's TPOT and is shown as TPOT, its percentiles over requests weighted by their "
              "tokens; its TPOT includes the TTFT and is not shown; it keeps no gap distribution, so ITL is "
              "empty; req/s and tok/s are the means of its rate over all its requests (its `total`, the figures its "
              "console prints); incomplete: requests still in flight at its cut-off, neither finished nor failed; rate "
              "the strategy's (constant or poisson; inf for throughput, '-' for synchronous and concurrent)",
    AIPERF: "TTFT from sending the request; its ITL, (latency − TTFT) ÷ (output tokens − 1) per request, is "
            "batchlab's TPOT and is shown as TPOT; its inter-chunk latency (gaps between streamed chunks, "
            "vLLM's ITL) is shown as ITL; rate its --request-rate, its arrival type (poisson, constant) in the label "
            "('-' when it ran at a concurrency); it counts no incomplete requests",
}


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
    unplaced = tuple(k for k, v in data.items() if isinstance(v, (int, float, list)) and not isinstance(v, bool)
                     and k not in VLLM_PLACED and not VLLM_SHOWN.fullmatch(k) and not k.startswith("batchlab_"))
    return ExternalPoint(f"{name} [{path.stem}]", path, KIND, _rate(data.get("request_rate")),
                         float(data["output_throughput"]), float(data["request_throughput"]),
                         int(data.get("completed") or 0), int(data.get("failed") or 0), latency, unplaced=unplaced)


def _figured(path: Path, points: list[ExternalPoint]) -> list[ExternalPoint]:
    """The points, each with at least one figure (ReportError for a run of the format holding none)."""
    for p in points:
        if math.isnan(p.throughput_tok_s) and all(v is None for q in p.latency.values() for v in q.values()):
            raise ReportError(f"--extra {path}: a corrupt result file ({p.label} holds no figure batchlab "
                              f"reads); batchlab reads {ACCEPTED}")
    return points


def points_of(path: Path, data: object) -> list[ExternalPoint] | None:
    """The points of one result file of a format batchlab reads; None for any other content."""
    if is_vllm_result(data):
        return [vllm_point(path, data)]
    if is_guidellm(data):
        return _figured(path, guidellm_points(path, data))
    if is_aiperf(data):
        return _figured(path, [aiperf_point(path, data)])
    return None


def _given(path: Path) -> list[ExternalPoint]:
    """The points of a file given with --extra: ReportError, naming it and the formats read, otherwise."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"--extra {path}: cannot read it as JSON ({exc}); batchlab reads {ACCEPTED}") from None
    try:
        points = points_of(path, data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ReportError(f"--extra {path}: a corrupt result file ({type(exc).__name__}: {exc}); "
                          f"batchlab reads {ACCEPTED}") from None
    if points is None:
        raise ReportError(f"--extra {path}: not a result file batchlab reads; it reads {ACCEPTED}")
    return points


def _found(path: Path) -> list[ExternalPoint]:
    """The points of a JSON file found in the results folder ([] for any other file, left alone)."""
    try:
        return points_of(path, json.loads(path.read_text())) or []
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ReportError):
        return []


def load_external(folder: str | Path, files: list[str] | None = None) -> list[ExternalPoint]:
    """The files given (each must be of a format batchlab reads: ReportError otherwise), then such results
    among the JSON files directly in `folder` (others are left alone), by rate then label."""
    given = [Path(f) for f in files or []]
    points = [p for path in given for p in _given(path)]
    resolved = {p.resolve() for p in given}
    for path in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        if path.resolve() not in resolved:
            points.extend(_found(path))
    return sorted(points, key=lambda p: (p.rate if not math.isnan(p.rate) else math.inf, p.label))


def table_rows(points: list[ExternalPoint], metrics: tuple[str, ...], missing: str) -> list[list[str]]:
    """Each point's cells: run, tool, rate, counts (incomplete: `missing` where the tool counts none), req/s,
    tok/s, then each metric's p50 / p99 in ms."""
    return [[p.label, p.kind, figure(p.rate, "g"), str(p.completed), str(p.failed),
             missing if p.incomplete is None else str(p.incomplete), figure(p.requests_per_s, ".2f"),
             figure(p.throughput_tok_s, ".0f" if p.throughput_tok_s >= 100 else ".3g"),
             *(p50_p99(p.latency, m, missing) for m in metrics)] for p in points]


def section(points: list[ExternalPoint]) -> list[str]:
    """REPORT.md lines: the external points' table and each tool's definitions ([] when there are none)."""
    if not points:
        return []
    kinds = sorted({p.kind for p in points})
    out = ["", "## Other tools' runs", "",
           "Result files of other tools, drawn as stars in the latency plot. Their figures are the tool's "
           "own, measured by it; latencies in ms as p50 / p99, '-' where the file has no such figure. "
           "Where the definitions differ from batchlab's:", ""]
    out += [f"- {kind}: {DEFINITIONS[kind]}." for kind in kinds]
    head = ["run", "tool", "rate req/s", "completed", "failed", "incomplete", "req/s", "out tok/s", "TTFT", "TPOT",
            "ITL", "E2E"]
    out += [""] + md_table(head, table_rows(points, POINT_METRICS, "-"))
    out += ["", "Each run's latencies in full, ms (mean / p50 / p90 / p95 / p99; '-' where the file has none):",
            ""] + md_table(["run", *(m.upper() for m in POINT_METRICS)], [
                [p.label, *(" / ".join(ms(p.latency[m][q], "-") for q in POINT_QUANTILES) for m in POINT_METRICS)]
                for p in points])
    unplaced = [p for p in points if p.unplaced]
    if unplaced:
        out += ["", "Figures these files hold that the table does not show (read them in the file):", ""]
        out += [f"- {p.label}: {', '.join(p.unplaced)}" for p in unplaced]
    return out
