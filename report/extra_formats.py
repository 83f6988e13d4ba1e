"""GuideLLM's and AIPerf's result files as external points, their figures in batchlab's units.

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
import math
from pathlib import Path

from batchlab.report.external_point import ExternalPoint, empty_latency, number
from batchlab.report.points import ReportError

GUIDELLM = "guidellm"
AIPERF = "aiperf"
# batchlab's metric → GuideLLM's GenerativeMetrics field and its unit in s. GuideLLM's inter_token_latency_ms
# is per request (last token − first token) ÷ (output tokens − 1), batchlab's TPOT; its
# time_per_output_token_ms includes the TTFT and has no batchlab counterpart; it keeps no gap distribution (ITL)
GUIDELLM_METRICS = {"ttft": ("time_to_first_token_ms", 1e-3), "tpot": ("inter_token_latency_ms", 1e-3),
                    "e2e": ("request_latency", 1.0)}
# batchlab's metric → AIPerf's metric tag. AIPerf's inter_token_latency is per request (latency − TTFT) ÷
# (output tokens − 1), batchlab's TPOT; its inter_chunk_latency (gaps between streamed chunks) is vLLM's ITL
AIPERF_METRICS = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "itl": "inter_chunk_latency",
                  "e2e": "request_latency"}
AIPERF_TIME_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}  # aiperf MetricTimeUnit tags
# the AIPerf metric tags the point holds beside AIPERF_METRICS (any other tag is named as not placed)
AIPERF_PLACED = {"request_throughput", "output_token_throughput", "request_count", "error_request_count"}


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


def _seconds(found: dict, unit_s: float) -> dict:
    """Each quantile's figure in s (None where the file has no number)."""
    return {q: None if number(v) is None else number(v) * unit_s for q, v in found.items()}


def _successful(metrics: dict, name: str) -> dict:
    """The successful requests' DistributionSummary of one GuideLLM metric ({} when absent)."""
    return _dict(_dict(metrics.get(name)).get("successful"))


def _guidellm_latency(metrics: dict) -> dict:
    latency = empty_latency()
    for metric, (name, unit_s) in GUIDELLM_METRICS.items():
        summary = _successful(metrics, name)
        if number(summary.get("count")) == 0:  # no request succeeded: GuideLLM writes 0.0 for every figure
            continue
        pct = _dict(summary.get("percentiles"))
        found = {"mean": summary.get("mean"), "p50": pct.get("p50", summary.get("median")),
                 "p90": pct.get("p90"), "p95": pct.get("p95"), "p99": pct.get("p99")}
        latency[metric] = _seconds(found, unit_s)
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
        found = {"mean": result.get("avg"), "p50": result.get("p50"), "p90": result.get("p90"),
                 "p95": result.get("p95"), "p99": result.get("p99")}
        latency[metric] = _seconds(found, unit_s)
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


def _aiperf_unplaced(data: dict) -> tuple[str, ...]:
    """The file's metric tags (a dict with a unit) that the point does not hold."""
    placed = AIPERF_PLACED | set(AIPERF_METRICS.values())
    return tuple(tag for tag, v in data.items() if isinstance(v, dict) and "unit" in v and tag not in placed)


def aiperf_point(path: Path, data: dict) -> ExternalPoint:
    """The point of one AIPerf run (its arrival type and request rate, else its concurrency, names it)."""
    kind, rate, concurrency = _aiperf_load(data)
    tail = (f"@ {rate:g} req/s" if rate is not None else
            f"@ concurrency {concurrency:g}" if concurrency is not None else "profile")
    tail = f"{kind} {tail}" if kind and rate is not None else tail
    return ExternalPoint(f"{AIPERF}: {tail} [{path.stem}]", path, AIPERF, math.nan if rate is None else rate,
                         _aiperf_per_s(path, data.get("output_token_throughput"), "output_token_throughput"),
                         _aiperf_per_s(path, data.get("request_throughput"), "request_throughput"),
                         _aiperf_count(data, "request_count"), _aiperf_count(data, "error_request_count"),
                         _aiperf_latency(path, data), unplaced=_aiperf_unplaced(data))
