"""Other tools' result files beside batchlab's strategies: `vllm bench serve --save-result` JSON, GuideLLM's
benchmarks.json and AIPerf's profile_export_aiperf.json, told apart by their content.

A vLLM file is one point; a GuideLLM report one point per benchmark; an AIPerf export one point. Each carries
its label, its offered request rate, its measured throughput and its latencies, in seconds like batchlab's
figures. The report draws them as marked points and lists them in their own table, with the definitions that
differ from batchlab's stated once per tool.

Field names come from the pydantic models that write the files (paths in each project's repository):
GuideLLM `src/guidellm/benchmark/schemas/report.py` (GenerativeBenchmarksReport: `benchmarks`),
`schemas/benchmark.py` (GenerativeBenchmark: `config`, `metrics`), `schemas/metrics.py` (GenerativeMetrics),
`src/guidellm/schemas/statistics.py` (StatusDistributionSummary → DistributionSummary: `mean`, `median`,
`percentiles.p50/p90/p99`) and `src/guidellm/scheduler/strategies.py` (`type_`, `rate`, `streams`); releases
before 0.7 keep the strategy under `args` and the counts at the benchmark's top level
(`src/guidellm/benchmark/benchmark.py` of v0.3). AIPerf `aiperf/common/models/export_models.py`
(JsonExportData: one JsonMetricResult per metric tag, `unit`, `avg`, `p50`, `p90`, `p99`),
`aiperf/metrics/types/*.py` (the tags and units); the load is `input_config.phases` (0.13: one entry per
phase, `kind` "profiling", `type` poisson/constant/..., `rate`, `concurrency`), before that
`input_config.loadgen` (`aiperf/common/config/loadgen_config.py`: `request_rate`, `concurrency`).
"""
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from batchlab.report.points import ReportError
from batchlab.report.text import figure, md_table, ms, p50_p99

__all__ = ["ExternalPoint", "load_external", "section"]

POINT_METRICS = ("ttft", "tpot", "itl", "e2e")  # batchlab's latency names, in the report's column order
POINT_QUANTILES = ("mean", "p50", "p90", "p95", "p99")  # p95: GuideLLM's console prints it


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
    return {m: dict.fromkeys(POINT_QUANTILES) for m in POINT_METRICS}


GUIDELLM = "guidellm"
AIPERF = "aiperf"
# batchlab's metric → GuideLLM's GenerativeMetrics field and its unit in s (DEFINITIONS[GUIDELLM]: its
# inter_token_latency_ms is batchlab's TPOT; its time_per_output_token_ms includes the TTFT and has no place)
GUIDELLM_METRICS = {"ttft": ("time_to_first_token_ms", 1e-3), "tpot": ("inter_token_latency_ms", 1e-3),
                    "e2e": ("request_latency", 1.0)}
# batchlab's metric → AIPerf's metric tag (DEFINITIONS[AIPERF]: its inter_token_latency is batchlab's TPOT)
AIPERF_METRICS = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
                  "e2e": "request_latency"}
AIPERF_TIME_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}  # aiperf MetricTimeUnit tags
# the AIPerf metric tags the point holds (any other tag, a dict with a unit, is named as not placed)
AIPERF_PLACED = {"request_throughput", "output_token_throughput", "request_count", "error_request_count",
                 *AIPERF_METRICS.values()}


def is_guidellm(data: object) -> bool:
    """A GuideLLM report: a list of benchmarks, each with its GenerativeMetrics."""
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    return (isinstance(benchmarks, list) and bool(benchmarks)
            and all(isinstance(b, dict) and isinstance(b.get("metrics"), dict) for b in benchmarks)
            and all(any(isinstance(b["metrics"].get(name), dict) for name in ("request_latency",
                                                                              "time_to_first_token_ms"))
                    for b in benchmarks))


def is_aiperf(data: object) -> bool:
    """An AIPerf profile_export_aiperf.json: metric tags mapping to {unit, avg, ...}."""
    return (isinstance(data, dict) and isinstance(data.get("request_throughput"), dict)
            and "unit" in data["request_throughput"]
            and any(isinstance(data.get(tag), dict) for tag in ("time_to_first_token", "request_latency")))


def _dict(value: object) -> dict:
    """A JSON object as it is; {} for anything else (absent, a list, a number)."""
    return value if isinstance(value, dict) else {}


def _quantiles_s(found: dict, unit_s: float) -> dict:
    """Each quantile's figure in s (None where the file has no number)."""
    return {q: None if number(v) is None else number(v) * unit_s for q, v in found.items()}


def _guidellm_latency(metrics: dict) -> dict:
    latency = empty_latency()
    for metric, (name, unit_s) in GUIDELLM_METRICS.items():
        summary = _dict(_dict(metrics.get(name)).get("successful"))  # the successful requests' DistributionSummary
        if number(summary.get("count")) == 0:  # no request succeeded: GuideLLM writes 0.0 for every figure
            continue
        pct = _dict(summary.get("percentiles"))
        found = {"mean": summary.get("mean"), "p50": pct.get("p50", summary.get("median")),
                 "p90": pct.get("p90"), "p95": pct.get("p95"), "p99": pct.get("p99")}
        latency[metric] = _quantiles_s(found, unit_s)
    return latency


def _guidellm_strategy(bench: dict) -> tuple[str, float]:
    """The point's label tail and its offered rate (req/s; inf for throughput, NaN without a rate)."""
    config = bench.get("config") if isinstance(bench.get("config"), dict) else bench.get("args")
    strategy = _dict(_dict(config).get("strategy"))
    kind = str(strategy.get("type_") or "benchmark")
    rate, streams = number(strategy.get("rate")), number(strategy.get("streams"))
    if rate is not None:
        return f"{kind} @ {rate:g} req/s", rate
    if kind == "throughput":
        return kind, math.inf
    return (f"{kind} @ {streams:g} streams" if streams is not None else kind), math.nan


def _guidellm_counts(bench: dict) -> tuple[int, int, int | None]:
    """Successful, errored and incomplete requests (GenerativeMetrics.request_totals; before 0.7, the
    benchmark's); incomplete ones were still in flight at its cut-off (None where the file has no count)."""
    totals = _dict(bench["metrics"].get("request_totals", bench.get("request_totals")))
    incomplete = number(totals.get("incomplete"))
    return (int(number(totals.get("successful")) or 0), int(number(totals.get("errored")) or 0),
            None if incomplete is None else int(incomplete))


def _guidellm_rate(metrics: dict, name: str) -> float:
    """A per-second rate as GuideLLM's console prints it: the mean over all requests (`total`), else the
    successful ones' (a file without `total`); NaN without either."""
    summary = _dict(metrics.get(name))
    value = number(_dict(summary.get("total")).get("mean"))
    value = number(_dict(summary.get("successful")).get("mean")) if value is None else value
    return math.nan if value is None else value


# GuideLLM's metrics the point holds (any other metric of the file is named as not placed)
GUIDELLM_PLACED = {"request_totals", "requests_per_second", "output_tokens_per_second",
                   *(name for name, _ in GUIDELLM_METRICS.values())}


def guidellm_points(path: Path, data: dict) -> list[ExternalPoint]:
    """One point per GuideLLM benchmark (a rate or a strategy of its profile)."""
    points = []
    for bench in data["benchmarks"]:
        metrics = bench["metrics"]
        tail, rate = _guidellm_strategy(bench)
        completed, failed, incomplete = _guidellm_counts(bench)
        unplaced = tuple(k for k, v in metrics.items() if isinstance(v, dict) and k not in GUIDELLM_PLACED)
        points.append(ExternalPoint(f"{GUIDELLM}: {tail} [{path.stem}]", path, GUIDELLM, rate,
                                    _guidellm_rate(metrics, "output_tokens_per_second"),
                                    _guidellm_rate(metrics, "requests_per_second"), completed, failed,
                                    _guidellm_latency(metrics), incomplete, unplaced))
    return points


def _aiperf_per_s(path: Path, result: object, name: str) -> float:
    """An AIPerf rate (unit "<things>/<time unit>") per second; NaN when the file lacks it."""
    if not isinstance(result, dict) or number(result.get("avg")) is None:
        return math.nan
    unit = str(result.get("unit", "")).rsplit("/", 1)[-1]
    if unit not in AIPERF_TIME_S:
        raise ReportError(f"--extra {path}: AIPerf metric {name} has unit {result.get('unit')!r}, not per time")
    return number(result["avg"]) / AIPERF_TIME_S[unit]


def _aiperf_latency(path: Path, data: dict) -> dict:
    latency = empty_latency()
    for metric, tag in AIPERF_METRICS.items():
        result = data.get(tag)
        if not isinstance(result, dict):
            continue
        unit_s = AIPERF_TIME_S.get(str(result.get("unit")))
        if unit_s is None:
            raise ReportError(f"--extra {path}: AIPerf metric {tag} has unit {result.get('unit')!r}, "
                              f"not one of {', '.join(AIPERF_TIME_S)}")
        found = {q: result.get("avg" if q == "mean" else q) for q in POINT_QUANTILES}
        latency[metric] = _quantiles_s(found, unit_s)
    return latency


def _aiperf_count(data: dict, tag: str) -> int:
    return int(number(_dict(data.get(tag)).get("avg")) or 0)


def _aiperf_load(data: dict) -> tuple[str, float | None, float | None]:
    """(arrival type, request rate, concurrency) of the run: 0.13's profiling phase (else its first), or
    the older loadgen layout ("" for a type it does not write)."""
    config = _dict(data.get("input_config"))
    phases = [p for p in config.get("phases") or [] if isinstance(p, dict)]
    if phases:
        phase = next((p for p in phases if p.get("kind") == "profiling"), phases[0])
        return str(phase.get("type") or ""), number(phase.get("rate")), number(phase.get("concurrency"))
    loadgen = _dict(config.get("loadgen"))
    return "", number(loadgen.get("request_rate")), number(loadgen.get("concurrency"))


def aiperf_point(path: Path, data: dict) -> ExternalPoint:
    """The point of one AIPerf run (its arrival type and request rate, else its concurrency, names it)."""
    kind, rate, concurrency = _aiperf_load(data)
    tail = (f"@ {rate:g} req/s" if rate is not None else
            f"@ concurrency {concurrency:g}" if concurrency is not None else "profile")
    tail = f"{kind} {tail}" if kind and rate is not None else tail
    unplaced = tuple(tag for tag, v in data.items() if isinstance(v, dict) and "unit" in v and tag not in AIPERF_PLACED)
    return ExternalPoint(f"{AIPERF}: {tail} [{path.stem}]", path, AIPERF, math.nan if rate is None else rate,
                         _aiperf_per_s(path, data.get("output_token_throughput"), "output_token_throughput"),
                         _aiperf_per_s(path, data.get("request_throughput"), "request_throughput"),
                         _aiperf_count(data, "request_count"), _aiperf_count(data, "error_request_count"),
                         _aiperf_latency(path, data), unplaced=unplaced)


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


TABLE_HEAD = ("run", "tool", "rate req/s", "completed", "failed", "incomplete", "req/s", "out tok/s")


def table_rows(points: list[ExternalPoint], metrics: tuple[str, ...], missing: str) -> list[list[str]]:
    """Each point's cells: run, tool, rate, counts (incomplete: `missing` where the tool counts none), req/s,
    tok/s (TABLE_HEAD), then each metric's p50 / p99 in ms."""
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
    head = [*TABLE_HEAD, *(m.upper() for m in POINT_METRICS)]
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
