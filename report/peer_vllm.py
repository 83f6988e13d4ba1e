"""`vllm bench serve --save-result` results: one point each, with every figure its console prints.

Three files hold them: the --save-result JSON (one result), --append-result's file (one result per line;
`vllm/benchmarks/serve.py` main_async opens it with mode "a+" and writes a newline before each later one) and
`vllm bench sweep serve`'s summary.json (a list of the results of a parameter combination, each with its
`run_number` and the swept parameters: `vllm/benchmarks/sweep/serve.py`, `_update_run_data`). batchlab's own
`--save-result` files carry vLLM's keys too, with `batchlab_definitions` saying where batchlab's differ.

What vLLM 0.32's console prints is `benchmark()` in `vllm/benchmarks/serve.py` (CONSOLE below, in its order,
then each metric's Mean, Median and P<n>), and before the run its traffic (`Traffic request rate`,
`Burstiness factor`, `Maximum request concurrency`). Definitions (`calculate_metrics`, and
`benchmarks/lib/endpoint_request_func.py`): TTFT = first chunk − the moment the request is posted; E2EL
(`latency`) = last chunk − that moment; TPOT = (E2EL − TTFT) ÷ (output tokens − 1) per request of more than one
token; ITL = the gaps between consecutive streamed chunks, pooled over every request (a chunk of k tokens is one
gap); percentiles are numpy's linear ones.
"""
import math
import re
from pathlib import Path

from batchlab.report.peer_point import ExternalPoint, Figure, count, number

KIND = "vllm bench serve"
OWN = "batchlab --save-result"  # a batchlab run's figures under vLLM's keys (collector.vllm_result)
REQUIRED = ("request_throughput", "output_throughput")
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}  # batchlab's metric → vLLM's key stem
QUANTILES = {"mean": "mean", "p50": "median", "p90": "p90", "p95": "p95", "p99": "p99"}  # → vLLM's key prefix
# the console's lines: (what it prints, the result key, the unit); printed where the file has the key
CONSOLE = (("Successful requests", "completed", "requests"), ("Failed requests", "failed", "requests"),
           ("Maximum request concurrency", "max_concurrency", "requests"),
           ("Request rate configured (RPS)", "request_rate", "req/s"), ("Burstiness factor", "burstiness", ""),
           ("Benchmark duration (s)", "duration", "s"), ("Total input tokens", "total_input_tokens", "tokens"),
           ("Total generated tokens", "total_output_tokens", "tokens"),
           ("Request throughput (req/s)", "request_throughput", "req/s"),
           ("Request goodput (req/s)", "request_goodput", "req/s"),
           ("Output token throughput (tok/s)", "output_throughput", "tok/s"),
           ("Peak output token throughput (tok/s)", "max_output_tokens_per_s", "tok/s"),
           ("Peak concurrent requests", "max_concurrent_requests", "requests"),
           ("RTFx (Inverse Real-Time Factor)", "rtfx", ""),
           ("Total token throughput (tok/s)", "total_token_throughput", "tok/s"),
           ("Probe requests completed", "probe_completed", "requests"),
           ("Probe requests failed", "probe_failed", "requests"),
           ("Median probe E2EL (ms)", "probe_median_e2el_ms", "ms"), ("P99 probe E2EL (ms)", "probe_p99_e2el_ms", "ms"),
           ("Max probe E2EL (ms)", "probe_max_e2el_ms", "ms"))
# each latency's section header and name on the console (process_one_metric)
LATENCIES = (("ttft", "Time to First Token", "TTFT"), ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
             ("itl", "Inter-token Latency", "ITL"), ("e2el", "End-to-end Latency", "E2EL"),
             ("client_queue_time", "Client-side Queueing", "Client Queue Time"),
             ("e2el_including_client_queue", "Queue-inclusive End-to-end Latency", "E2EL incl. Client Queue"))
LATENCY_KEY = re.compile(rf"(mean|median|std|p\d+(?:\.\d+)?)_({'|'.join(s for s, _, _ in LATENCIES)})_ms")
# keys that describe the run rather than measure it (never named as figures left out)
SETUP = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "run_number",
         "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"}
DEFINITION = ("TTFT from posting the request; TPOT (E2EL − TTFT) ÷ (output tokens − 1) per request, as "
              "batchlab's; ITL the gaps between streamed chunks (a chunk of k tokens is one gap, not k); rate the "
              "one asked for (inf: all at once), its burstiness (1: Poisson) and --max-concurrency in the load column")
OWN_DEFINITION = ("a batchlab run's own figures in vLLM's keys (its batchlab_definitions): TTFT and E2E from the "
                  "request's arrival at batchlab's scheduler, queueing included; ITL every gap between tokens")


def is_result(data: object) -> bool:
    """A `vllm bench serve` result (vLLM's own or a batchlab run's --save-result)."""
    return isinstance(data, dict) and all(k in data for k in REQUIRED) and "median_ttft_ms" in data


def is_batchlab(data: dict) -> bool:
    """A batchlab run's --save-result (vllm_result.json), told by its batchlab_definitions."""
    return "batchlab_definitions" in data


def is_sweep_summary(data: object) -> bool:
    """`vllm bench sweep serve`'s summary.json: a list of results."""
    return isinstance(data, list) and bool(data) and all(is_result(d) for d in data)


def _rate(value: object) -> float:
    """vLLM's request_rate: a number, or "inf" for all at once (NaN for anything else)."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    found = number(value)
    return math.nan if found is None else found


def _seconds(data: dict, metric: str, q: str) -> float | None:
    """One latency figure in s (vLLM writes ms), None when the file lacks it (p50: median_, else p50_)."""
    stem = METRICS[metric]
    value = data.get(f"{QUANTILES[q]}_{stem}_ms")
    value = data.get(f"p50_{stem}_ms") if value is None and q == "p50" else value
    found = number(value)
    return None if found is None else found / 1e3


def load(data: dict) -> str:
    """The load as vLLM set it: rate and arrivals (burstiness), the cap on requests in flight, the prompts."""
    rate, burstiness, cap = _rate(data.get("request_rate")), number(data.get("burstiness")), data.get("max_concurrency")
    if math.isinf(rate):
        arrivals = "all at once (rate inf)"
    else:
        shape = ("Poisson" if burstiness == 1 else f"gamma, burstiness {burstiness:g}" if burstiness is not None
                 else "constant" if str(data.get("burstiness")).lower() in ("inf", "infinity") else "arrivals unknown")
        arrivals = f"{figure_text(rate)} req/s ({shape})"
    capped = f"at most {cap} in flight" if cap is not None else "no cap on requests in flight"
    prompts = f"{data['num_prompts']} prompts" if data.get("num_prompts") is not None else ""
    return ", ".join(p for p in (arrivals, capped, prompts) if p)


def figure_text(value: float) -> str:
    """A rate as text ('-' for NaN)."""
    return "-" if math.isnan(value) else f"{value:g}"


def _value(data: dict, key: str) -> float | str | None:
    """A console line's value: a number, or the text vLLM wrote (e.g. "inf")."""
    value = data.get(key)
    found = number(value)
    return found if found is not None else (str(value) if value is not None else None)


def figures(data: dict) -> list[Figure]:
    """Every figure vLLM's console prints for this result, as it names them."""
    out = [Figure(name, unit, {"": _value(data, key)}) for name, key, unit in CONSOLE if data.get(key) is not None]
    for stem, head, name in LATENCIES:
        found = {m.group(1): number(v) for k, v in data.items()
                 if (m := LATENCY_KEY.fullmatch(k)) and m.group(2) == stem}
        if found:
            out.append(Figure(head, "ms", {_stat_name(s, name): v for s, v in found.items()}))
    return out


def _stat_name(stat: str, name: str) -> str:
    """vLLM's console name of a statistic: 'Mean TTFT', 'P99 TTFT'."""
    return f"{stat.capitalize() if not stat.startswith('p') else stat.upper()} {name}"


def _unplaced(data: dict) -> tuple[str, ...]:
    """The numeric and list keys neither in the point nor among its console figures (named in the report)."""
    shown = {key for _, key, _ in CONSOLE} | SETUP
    return tuple(k for k, v in data.items() if isinstance(v, (int, float, list)) and not isinstance(v, bool)
                 and k not in shown and not LATENCY_KEY.fullmatch(k) and not k.startswith("batchlab_"))


def point(path: Path, data: dict, where: str = "") -> ExternalPoint:
    """The point of one vLLM result (`where`: which one of a file holding several)."""
    own = is_batchlab(data)
    name = data.get("label") or f"{data.get('backend') or 'vllm'} {data.get('model_id') or ''}".strip()
    latency = {m: {q: _seconds(data, m, q) for q in QUANTILES} for m in METRICS}
    throughput, per_s = number(data["output_throughput"]), number(data["request_throughput"])
    if throughput is None or per_s is None:
        raise ValueError(f"output_throughput {data['output_throughput']!r} or request_throughput "
                         f"{data['request_throughput']!r} is no finite number")
    head = f"batchlab {name}" if own else str(name)
    if "run_number" in data:
        where = f"run_number {data['run_number']}" + (f", {where}" if where else "")
    return ExternalPoint(head, path, OWN if own else KIND, _rate(data.get("request_rate")), throughput, per_s,
                         count(data.get("completed"), "completed"), count(data.get("failed"), "failed"), latency,
                         load=load(data), figures=figures(data), unplaced=_unplaced(data), where=where)


def points(path: Path, data: object) -> list[ExternalPoint] | None:
    """The points of a result, a sweep's summary.json or --append-result's lines (a list of results); None
    for anything else."""
    if is_result(data):
        return [point(path, data)]
    if is_sweep_summary(data):
        return [point(path, d, f"item {i + 1} of {len(data)}") for i, d in enumerate(data)]
    return None


def from_lines(path: Path, records: list[tuple[int, object]]) -> list[ExternalPoint] | None:
    """--append-result's file: (line number, result) per line (None unless every line holds one)."""
    if not records or not all(is_result(r) for _, r in records):
        return None
    return [point(path, r, f"line {n}") for n, r in records]

