"""GuideLLM's JSON report (`guidellm run --output kind=json,path=FILE`): one point per benchmark, with every
figure its console prints.

Field names come from the pydantic models that write the file (GuideLLM 0.8.1, `src/guidellm/`):
`benchmark/schemas/report.py` (GenerativeBenchmarksReport: `benchmarks`), `benchmark/schemas/benchmark.py`
(`config`, `metrics`, `duration`, `warnings`), `benchmark/schemas/metrics.py` (GenerativeMetrics),
`schemas/base/statistics.py` (StatusDistributionSummary → DistributionSummary: `mean`, `median`, `mean_ci`,
`percentiles.p50/p90/p95/p99`, `total_sum`), `benchmark/schemas/warnings.py` (BenchmarkWarning: `message`,
`note`) and `scheduler/strategies.py` (`type_`, `rate`, `streams`); releases before 0.7 keep the strategy
under `args` and the counts at the benchmark's top level (`benchmark/benchmark.py` of v0.3). What its console
prints is `benchmark/outputs/console.py` (GenerativeBenchmarkerConsole.finalize): the run summary, the
modality tables, request token statistics, request latency and server throughput, then the warnings.

Definitions (`schemas/base/request_stats.py`, GenerativeRequestStats): TTFT = first token − request start (ms);
ITL = (last token − first token) ÷ (output tokens − 1) per request, its distribution weighted by output
tokens − 1 (`metrics.py`: `(req.inter_token_latency_ms, output_tokens - 1)`); TPOT = (last token − request
start) ÷ output tokens, so it holds the TTFT, weighted by output tokens; request latency = request end −
request start (s); percentiles are the smallest value whose weighted CDF reaches p (`Percentiles.from_pdf`).
"""
import math
from datetime import datetime, timezone
from pathlib import Path

from batchlab.report.peer_point import ExternalPoint, Figure, as_dict, count, empty_latency, number

KIND = "guidellm"
# batchlab's metric → GuideLLM's GenerativeMetrics field, its unit in s and its console name where it differs
# (its ITL is batchlab's TPOT; its TPOT includes the TTFT and has no batchlab column)
METRICS = {"ttft": ("time_to_first_token_ms", 1e-3, ""), "tpot": ("inter_token_latency_ms", 1e-3, "ITL"),
           "e2e": ("request_latency", 1.0, "")}
# the console's latency table (Request Latency Statistics): its group name, the field and the unit it prints
LATENCY = (("Request Latency", "request_latency", "s"), ("TTFT", "time_to_first_token_ms", "ms"),
           ("TTFOT", "time_to_first_output_token_ms", "ms"), ("ITL", "inter_token_latency_ms", "ms"),
           ("TPOT", "time_per_output_token_ms", "ms"))
# Request Token Statistics (Completed Requests): group, field (Mdn and p95 of the successful requests)
TOKENS = (("Input Tok Per Req", "prompt_token_count"), ("Output Tok Per Req", "output_token_count"),
          ("Total Tok Per Req", "total_token_count"), ("Stream Iter Per Req", "request_streaming_iterations_count"),
          ("Output Tok Per Stream Iter", "output_tokens_per_iteration"))
# Server Throughput Statistics (All Requests): group, field, the statistics it prints (of all requests)
THROUGHPUT = (("Requests Concurrency", "request_concurrency", ("median", "mean"), "requests"),
              ("Requests Per Sec", "requests_per_second", ("mean",), "req/s"),
              ("Input Tokens Per Sec", "prompt_tokens_per_second", ("mean",), "tok/s"),
              ("Output Tokens Per Sec", "output_tokens_per_second", ("mean",), "tok/s"),
              ("Total Tokens Per Sec", "tokens_per_second", ("mean",), "tok/s"))
# the modality tables (`_print_modality_table`): modality → its metric groups
MODALITIES = {"text": ("tokens", "words", "characters"), "image": ("tokens", "images", "pixels", "bytes"),
              "video": ("tokens", "frames", "seconds", "bytes"), "audio": ("tokens", "samples", "seconds", "bytes"),
              "tool_call": ("tokens", "mixed_tokens", "count")}
STAT_NAMES = {"mean": "Mean", "median": "Mdn", "p95": "p95"}
# the metrics the point or its figures hold (any other metric of the file is named as not shown)
SHOWN = {"request_totals", *(f for _, f, _ in LATENCY), *(f for _, f in TOKENS), *(f for _, f, _, _ in THROUGHPUT),
         *MODALITIES, "slo_attainment", "request_goodput"}
DEFINITION = ("TTFT from sending the request; its ITL, (last − first token) ÷ (output tokens − 1) per request, is "
              "batchlab's TPOT and is shown in the TPOT column as its ITL, its percentiles over requests weighted "
              "by their tokens − 1; its TPOT, (last token − request start) ÷ output tokens, holds the TTFT and has "
              "no batchlab column (its figures list it); it keeps no gap distribution, so ITL is empty; req/s "
              "and tok/s are the means of its rate over all its requests (its `total`, the figures its console "
              "prints); incomplete: requests still in flight at its cut-off, neither finished nor failed; rate the "
              "strategy's (constant or poisson; inf for throughput, '-' for synchronous and concurrent)")


def is_guidellm(data: object) -> bool:
    """A GuideLLM report: a list of benchmarks, each with its GenerativeMetrics."""
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    return (isinstance(benchmarks, list) and bool(benchmarks)
            and all(isinstance(b, dict) and isinstance(b.get("metrics"), dict) for b in benchmarks)
            and all(any(isinstance(b["metrics"].get(name), dict) for name in ("request_latency",
                                                                              "time_to_first_token_ms"))
                    for b in benchmarks))


def _summary(metrics: dict, name: str, status: str = "successful") -> dict:
    """One DistributionSummary of a metric ({} where the file has none)."""
    return as_dict(as_dict(metrics.get(name)).get(status))


def _stat(summary: dict, stat: str) -> float | None:
    """mean, median or pNN of a DistributionSummary (median: else its p50)."""
    pct = as_dict(summary.get("percentiles"))
    if stat == "median":
        return number(summary.get("median", pct.get("p50")))
    return number(summary.get(stat)) if stat == "mean" else number(pct.get(stat))


def _latency(metrics: dict) -> dict:
    latency = empty_latency()
    for metric, (name, unit_s, _) in METRICS.items():
        summary = _summary(metrics, name)
        if number(summary.get("count")) == 0:  # no request succeeded: GuideLLM writes 0.0 for every figure
            continue
        found = {"mean": _stat(summary, "mean"), "p50": _stat(summary, "median"),
                 **{q: _stat(summary, q) for q in ("p90", "p95", "p99")}}
        latency[metric] = {q: None if v is None else v * unit_s for q, v in found.items()}
    return latency


def _strategy(bench: dict) -> tuple[str, float, str]:
    """The point's label tail, its offered rate (req/s; inf for throughput, NaN without a rate) and its load."""
    config = bench.get("config") if isinstance(bench.get("config"), dict) else bench.get("args")
    strategy = as_dict(as_dict(config).get("strategy"))
    kind = str(strategy.get("type_") or "benchmark")
    rate, streams = number(strategy.get("rate")), number(strategy.get("streams"))
    cap = number(strategy.get("max_concurrency"))
    load = ", ".join([kind, *([f"{rate:g} req/s"] if rate is not None else []),
                      *([f"{streams:g} streams"] if streams is not None else []),
                      *([f"at most {cap:g} in flight"] if cap is not None else [])])
    if rate is not None:
        return f"{kind} @ {rate:g} req/s", rate, load
    if kind == "throughput":
        return kind, math.inf, load
    return (f"{kind} @ {streams:g} streams" if streams is not None else kind), math.nan, load


def _counts(bench: dict) -> tuple[int, int, int | None]:
    """Successful, errored and incomplete requests (GenerativeMetrics.request_totals; before 0.7, the
    benchmark's); incomplete ones were still in flight at its cut-off (None where the file has no count)."""
    totals = as_dict(bench["metrics"].get("request_totals", bench.get("request_totals")))
    incomplete = totals.get("incomplete")
    return (count(totals.get("successful"), "request_totals.successful"),
            count(totals.get("errored"), "request_totals.errored"),
            None if incomplete is None else count(incomplete, "request_totals.incomplete"))


def _rate(metrics: dict, name: str) -> float:
    """A per-second rate as GuideLLM's console prints it: the mean over all requests (`total`), else the
    successful ones' (a file without `total`); NaN without either."""
    value = _stat(_summary(metrics, name, "total"), "mean")
    value = _stat(_summary(metrics, name), "mean") if value is None else value
    return math.nan if value is None else value


def _time(value: object) -> float | str | None:
    """A timestamp as the console's Start / End, in UTC."""
    found = number(value)
    if found is None or not 0 < found < 1e11:
        return None
    return datetime.fromtimestamp(found, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _margin(summary: dict) -> float | None:
    """The half-width of the mean's confidence interval (the console's "Mean ± m"), None without one."""
    ci = as_dict(summary.get("mean_ci"))
    lower, upper = number(ci.get("lower")), number(ci.get("upper"))
    return None if lower is None or upper is None else (upper - lower) / 2


def _summary_figures(bench: dict, metrics: dict) -> list[Figure]:
    """Run Summary Info: timings, then requests and tokens completed / incomplete / errored."""
    totals = as_dict(metrics.get("request_totals", bench.get("request_totals")))
    out = [Figure("Timings", "s", {"Start": _time(bench.get("start_time")), "End": _time(bench.get("end_time")),
                                   "Dur": number(bench.get("duration")), "Warm": number(bench.get("warmup_duration")),
                                   "Cool": number(bench.get("cooldown_duration"))}),
           Figure("Requests", "requests", {name: number(totals.get(key)) for name, key in
                                           (("Comp", "successful"), ("Inc", "incomplete"), ("Err", "errored"))})]
    for group, field in (("Input Tokens", "prompt_token_count"), ("Output Tokens", "output_token_count")):
        out.append(Figure(group, "tokens", {name: number(_summary(metrics, field, status).get("total_sum")) for
                                            name, status in (("Comp", "successful"), ("Inc", "incomplete"),
                                                             ("Err", "errored"))}))
    return out


def _modality_figures(metrics: dict) -> list[Figure]:
    """The modality tables: per request (Mdn, p95) and per second (Mdn, Mean), input and output, where the
    file has any figure of that modality (the console prints no table otherwise)."""
    out = []
    for modality, groups in MODALITIES.items():
        found = as_dict(metrics.get(modality))
        for group in groups:
            for side in ("input", "output"):
                for per, stats in ((side, ("median", "p95")), (f"{side}_per_second", ("median", "mean"))):
                    summary = _summary(as_dict(found.get(group)), per)
                    if summary:
                        what = f"{side.title()} {group.replace('_', ' ').title()}"
                        name = f"{modality}: {what} Per {'Second' if '_per_' in per else 'Request'}"
                        unit = group.replace("_", " ") + ("/s" if "_per_" in per else "")
                        out.append(Figure(name, unit, {STAT_NAMES[s]: _stat(summary, s) for s in stats}))
    return out


def figures(bench: dict) -> list[Figure]:
    """Every figure GuideLLM's console prints for one benchmark, in its order, as it names them."""
    metrics = bench["metrics"]
    out = _summary_figures(bench, metrics) + _modality_figures(metrics)
    out += [Figure(group, "per request", {STAT_NAMES[s]: _stat(_summary(metrics, field), s) for s in ("median", "p95")})
            for group, field in TOKENS if _summary(metrics, field)]
    for group, field, unit in LATENCY:
        summary = _summary(metrics, field)
        out.append(Figure(group, unit, {"Mean": _stat(summary, "mean"), "± (mean's CI)": _margin(summary),
                                        "Mdn": _stat(summary, "median"), "p95": _stat(summary, "p95")}))
    for group, field, stats, unit in THROUGHPUT:
        summary = _summary(metrics, field, "total") or _summary(metrics, field)
        out.append(Figure(group, unit, {STAT_NAMES[s]: _stat(summary, s) for s in stats}))
    if as_dict(bench.get("config")).get("slo") is not None:  # the console's Goodput columns
        attainment = number(metrics.get("slo_attainment"))
        out.append(Figure("Goodput", "", {"Attainment %": None if attainment is None else attainment * 100,
                                          "Per Sec": _stat(_summary(metrics, "request_goodput", "total"), "mean")}))
    return out


def warnings(bench: dict) -> list[str]:
    """The warnings GuideLLM printed for this benchmark (each its message and note)."""
    found = bench.get("warnings") if isinstance(bench.get("warnings"), list) else []
    return [" ".join(str(w.get(k) or "").strip() for k in ("message", "note")).strip() or str(w.get("code"))
            for w in found if isinstance(w, dict)]


def points(path: Path, data: dict) -> list[ExternalPoint]:
    """One point per GuideLLM benchmark (a rate or a strategy of its profile)."""
    out = []
    for i, bench in enumerate(data["benchmarks"]):
        metrics = bench["metrics"]
        tail, rate, load = _strategy(bench)
        completed, failed, incomplete = _counts(bench)
        unplaced = tuple(k for k, v in metrics.items() if isinstance(v, dict) and k not in SHOWN)
        out.append(ExternalPoint(
            f"{KIND}: {tail}", path, KIND, rate, _rate(metrics, "output_tokens_per_second"),
            _rate(metrics, "requests_per_second"), completed, failed, _latency(metrics), incomplete,
            names={m: name for m, (_, _, name) in METRICS.items() if name}, load=load, figures=figures(bench),
            warnings=warnings(bench), unplaced=unplaced,
            where=f"benchmark {i + 1} of {len(data['benchmarks'])}" if len(data["benchmarks"]) > 1 else ""))
    return out
