"""AIPerf's profile_export_aiperf.json (`aiperf profile`): one point, with every figure its console prints.

Field names come from AIPerf 0.13.0 (`aiperf/`): `common/models/export_models.py` (JsonExportData: one
JsonMetricResult per metric tag, `unit`, `avg`, `min`, `max`, `std`, `p50`, `p90`, `p95`, `p99`),
`metrics/types/*.py` (each metric's tag, header, unit, flags and console group); the load is
`input_config.phases` (0.13: one entry per phase, `kind` "profiling", `type` poisson/constant/..., `rate`,
`concurrency`), before that `input_config.loadgen` (`common/config/loadgen_config.py`: `request_rate`,
`concurrency`). Its console (`exporters/console_metrics_exporter.py`, ConsoleMetricsExporter) prints avg,
min, max, p99, p90, p50 and std of every metric except those of console group NONE and those flagged
ERROR_ONLY, INTERNAL, EXPERIMENTAL or HTTP_TRACE_ONLY (HIDDEN below, from `metrics/types/*.py` and
`metrics/derived_latency.py`), in tables Effective, Active, Usage, ..., then the main one.

Definitions (`metrics/types/`): TTFT (`ttft_metric.py`) = first response − request start; request latency
(`request_latency_metric.py`) = last response − request start; ITL (`inter_token_latency_metric.py`) =
(request latency − TTFT) ÷ (output sequence length − the first chunk's tokens, 1 unless the server reports
per-chunk usage) per request; inter-chunk latency (`inter_chunk_latency_metric.py`, console group NONE: the
console never prints it) = the gaps between consecutive streamed chunks, pooled over requests.
"""
import math
from pathlib import Path

from batchlab.report.peer_point import ExternalPoint, Figure, as_dict, count, empty_latency, number

KIND = "aiperf"
# batchlab's metric → AIPerf's metric tag and its name where it differs (its ITL is batchlab's TPOT; its
# inter-chunk latency, the gaps between streamed chunks, is batchlab's ITL of a stream of one token per chunk)
METRICS = {"ttft": ("time_to_first_token", ""), "tpot": ("inter_token_latency", "ITL"),
           "itl": ("inter_chunk_latency", "inter-chunk latency"), "e2e": ("request_latency", "")}
TIME_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}  # aiperf MetricTimeUnit tags
CONSOLE_STATS = ("avg", "min", "max", "p99", "p90", "p50", "std")  # ConsoleMetricsExporter.DEFAULT_STAT_KEYS
# the tags AIPerf 0.13's console leaves out (see the module's docstring)
HIDDEN = {
    "audio_duration", "benchmark_duration", "context_overflow_count", "credit_drop_latency",
    "credit_to_start_latency", "error_isl", "error_request_count", "good_request_count", "good_request_fraction",
    "inter_chunk_latency", "max_response_timestamp", "min_request_timestamp", "num_images", "osl_mismatch_count",
    "osl_mismatch_diff_pct", "output_token_count", "overall_thinking_efficiency", "prefill_throughput_per_user",
    "reasoning_token_count", "replay_sched_degraded", "replay_sched_lag_p50", "replay_sched_lag_p90",
    "replay_sched_lag_p99", "replay_send_schedule_offset", "requested_osl", "spec_decode_accepted_draft_tokens",
    "spec_decode_draft_tokens", "stream_prefill_latency", "stream_setup_latency", "thinking_efficiency",
    "total_accepted_draft_tokens", "total_draft_tokens", "total_error_isl", "total_isl", "total_osl",
    "total_output_tokens", "total_reasoning_tokens", "total_spec_decode_steps", "total_token_throughput",
    "usage_completion_tokens_diff_pct", "usage_discrepancy_count", "usage_prompt_tokens_diff_pct",
    "usage_reasoning_tokens_diff_pct"}
HIDDEN_PREFIXES = ("http_req_", "nvidia_", "amd_")  # HTTP trace and GPU power metrics: other exporters' tables
# the console's row names (each metric's `header`) where the tag's words differ from it
HEADERS = {
    "time_to_first_token": "Time to First Token", "time_to_second_token": "Time to Second Token",
    "time_to_first_output_token": "Time to First Output Token", "inter_token_latency": "Inter Token Latency",
    "completed_request_count": "Completed Requests (Success + Error)", "e2e_output_token_throughput":
    "E2E Output Token Throughput", "rtfx": "Inverse Real-Time Factor (RTFx)", "effective_latency":
    "Effective Latency (CO-aware)", "network_rtt": "Network RTT", "spec_decode_acceptance_length":
    "Acceptance Length", "spec_decode_draft_acceptance_rate": "Draft Acceptance Rate",
    "spec_decode_accepted_per_verified": "Accepted per Verified", "overall_usage_prompt_cache_read_pct":
    "Overall Usage Prompt Cache Read %"}
COUNTS = ("request_count", "error_request_count")  # the completed and failed counts the point holds
DEFINITION = ("TTFT from sending the request; its ITL, (request latency − TTFT) ÷ (output sequence length − 1) "
              "per request, is batchlab's TPOT and is shown in the TPOT column as its ITL; its inter-chunk "
              "latency (the gaps between streamed chunks, vLLM's ITL; its console never prints it) is shown in the "
              "ITL column under that name; rate its --request-rate, its arrival type (poisson, constant) in the "
              "label ('-' when it ran at a concurrency); it counts no incomplete requests")


def is_aiperf(data: object) -> bool:
    """An AIPerf profile_export_aiperf.json: metric tags mapping to {unit, avg, ...}."""
    return (isinstance(data, dict) and isinstance(data.get("request_throughput"), dict)
            and "unit" in data["request_throughput"]
            and any(isinstance(data.get(tag), dict) for tag in ("time_to_first_token", "request_latency")))


def _metrics(data: dict) -> dict[str, dict]:
    """The file's metric results: tag → {unit, avg, ...}."""
    return {tag: v for tag, v in data.items() if isinstance(v, dict) and "unit" in v}


def printed(tag: str) -> bool:
    """Whether AIPerf's console prints this metric."""
    return tag not in HIDDEN and not tag.startswith(HIDDEN_PREFIXES)


def header(tag: str) -> str:
    """The metric's console name: its header, else its tag's words."""
    return HEADERS.get(tag) or tag.replace("_", " ").title()


def _per_s(result: object, name: str) -> float:
    """An AIPerf rate (unit "<things>/<time unit>") per second; NaN when the file lacks it."""
    if not isinstance(result, dict) or number(result.get("avg")) is None:
        return math.nan
    unit = str(result.get("unit", "")).rsplit("/", 1)[-1]
    if unit not in TIME_S:
        raise ValueError(f"AIPerf metric {name} has unit {result.get('unit')!r}, not per time")
    return number(result["avg"]) / TIME_S[unit]


def _latency(data: dict) -> dict:
    latency = empty_latency()
    for metric, (tag, _) in METRICS.items():
        result = data.get(tag)
        if not isinstance(result, dict):
            continue
        unit_s = TIME_S.get(str(result.get("unit")))
        if unit_s is None:
            raise ValueError(f"AIPerf metric {tag} has unit {result.get('unit')!r}, not one of {', '.join(TIME_S)}")
        latency[metric] = {q: None if number(result.get(k)) is None else number(result.get(k)) * unit_s
                           for q, k in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p95", "p95"),
                                        ("p99", "p99"))}
    return latency


def _load(data: dict) -> tuple[str, float | None, float | None]:
    """(arrival type, request rate, concurrency) of the run: 0.13's profiling phase (else its first), or
    the older loadgen layout ("" for a type it does not write)."""
    config = as_dict(data.get("input_config"))
    phases = [p for p in config.get("phases") or [] if isinstance(p, dict)]
    if phases:
        phase = next((p for p in phases if p.get("kind") == "profiling"), phases[0])
        return str(phase.get("type") or ""), number(phase.get("rate")), number(phase.get("concurrency"))
    loadgen = as_dict(config.get("loadgen"))
    return "", number(loadgen.get("request_rate")), number(loadgen.get("concurrency"))


def _error(entry: dict) -> str:
    """One ErrorDetailsCount of its error summary (`common/models/error_models.py`): how many, what."""
    details = as_dict(entry.get("error_details"))
    what = " ".join(str(details.get(k)) for k in ("code", "type") if details.get(k) is not None)
    return f"{entry.get('count', '?')} × {what + ': ' if what else ''}{details.get('message', '')}".strip()


def figures(data: dict) -> list[Figure]:
    """Every metric AIPerf's console prints, as it names it, with its avg, min, max, p99, p90, p50 and std."""
    return [Figure(header(tag), str(result.get("unit")), {k: number(result.get(k)) for k in CONSOLE_STATS
                                                          if k in result})
            for tag, result in _metrics(data).items() if printed(tag)]


def point(path: Path, data: dict) -> ExternalPoint:
    """The point of one AIPerf run (its arrival type and request rate, else its concurrency, names it)."""
    kind, rate, concurrency = _load(data)
    tail = (f"@ {rate:g} req/s" if rate is not None else
            f"@ concurrency {concurrency:g}" if concurrency is not None else "profile")
    tail = f"{kind} {tail}" if kind and rate is not None else tail
    load = ", ".join([*([kind] if kind else []), *([f"{rate:g} req/s"] if rate is not None else []),
                      f"concurrency {concurrency:g}" if concurrency is not None else "no concurrency limit"])
    results = _metrics(data)
    completed, failed = (count(as_dict(data.get(tag)).get("avg"), tag) for tag in COUNTS)
    unplaced = tuple(tag for tag in results if not printed(tag) and tag not in COUNTS
                     and tag not in {t for t, _ in METRICS.values()})
    errors = [_error(e) for e in data.get("error_summary") or [] if isinstance(e, dict)]
    return ExternalPoint(
        f"{KIND}: {tail}", path, KIND, math.nan if rate is None else rate,
        _per_s(data.get("output_token_throughput"), "output_token_throughput"),
        _per_s(data.get("request_throughput"), "request_throughput"), completed, failed, _latency(data),
        names={m: name for m, (_, name) in METRICS.items() if name}, load=load, figures=figures(data),
        warnings=errors, unplaced=unplaced)
