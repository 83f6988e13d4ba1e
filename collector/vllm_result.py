"""A run's figures as `vllm bench serve --save-result` writes them: its keys, its units (ms, per s).

Computed from batchlab's own tables (requests.parquet, tokens.parquet, summary.json), so a script
written for vLLM's result files reads a batchlab run unchanged; `batchlab_definitions` names where
batchlab's figures are defined differently from vLLM's.
"""
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.collector.metrics import inter_token_latencies, request_metrics
from batchlab.collector.summary import Summary, read_summary
from batchlab.protocol.environment import batchlab_version
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir

PERCENTILES = (50, 90, 99)  # vLLM's --metric-percentiles (its default is 99 alone)
METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}  # vLLM's name → batchlab's column
DEFINITIONS = {
    "source": "batchlab's requests.parquet, tokens.parquet and summary.json of this run",
    "duration": "batchlab's window: the first submitted arrival to the last finished completion, s "
                "(vLLM: the benchmark's wall time)",
    "ttft": "first token time minus the request's arrival at the scheduler (includes its queueing)",
    "tpot": "(completion − first token) ÷ (planned output length − 1), requests of more than one token "
            "(vLLM: the output tokens it counted)",
    "itl": "gaps between consecutive tokens of a finished request; a chunk of k tokens gives k − 1 zero gaps "
           "(vLLM: gaps between streamed chunks)",
    "e2el": "completion minus arrival at the scheduler",
    "request_goodput": "finished requests meeting every --slo ÷ duration (null without --slo)",
    "total_input_tokens": "prompt tokens of the finished requests (as vLLM counts them)",
    "max_concurrency": "the cap on requests in flight: the openai backend's --max-concurrency, or the closed "
                       "loop's --concurrency clients (null: no cap, as vLLM writes it)",
    "max_concurrent_requests": "the most finished requests in flight within one second, from arrival to "
                               "completion (vLLM: from sending)",
    "max_output_tokens_per_s": "the most tokens of finished requests emitted within one second",
    "burstiness": "the gamma shape of the arrivals: 1.0 for poisson, null for constant and trace arrivals and "
                  "the closed loop (vLLM: 1.0 means Poisson)",
    "latencies": "each finished request's e2e, s (vLLM: each request's, from sending)",
    "queue_times": "each finished request's wait from arrival to being scheduled, s (vLLM: the wait for a "
                   "--max-concurrency slot)",
}


def _stats(name: str, values_s: np.ndarray) -> dict:
    """mean/median/std/pNN in ms, as vLLM computes them (0 for no values)."""
    v = values_s[~np.isnan(values_s)] if values_s.size else values_s
    v = v if v.size else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1e3, f"median_{name}_ms": float(np.median(v)) * 1e3,
           f"std_{name}_ms": float(np.std(v)) * 1e3}
    return out | {f"p{p}_{name}_ms": float(value) * 1e3 for p, value in zip(PERCENTILES, np.percentile(v, PERCENTILES))}


def _burstiness(settings: dict) -> float | None:
    """vLLM's burstiness: the gamma shape, which vLLM draws every arrival from (1.0: Poisson); None where the
    arrivals are no gamma process (constant, a trace's own times, the closed loop)."""
    if settings.get("concurrency") or settings.get("arrival") not in ("poisson", "gamma"):
        return None
    return 1.0 if settings["arrival"] == "poisson" else settings.get("burstiness")


def _max_concurrency(settings: dict) -> int | None:
    """vLLM's --max-concurrency: the cap on requests in flight (the closed loop's clients, or the openai
    backend's streams); None where nothing caps them."""
    if settings.get("concurrency"):
        return int(settings["concurrency"])
    return int(settings["max_concurrency"]) if settings.get("backend") == "openai" else None


def _setup(folder: Path, summary: Summary) -> dict:
    """The setup keys of vLLM's result (date, backend, model, traffic)."""
    settings = summary.settings
    rate = settings.get("rate")
    rate = "inf" if rate is None or (isinstance(rate, float) and math.isinf(rate)) else rate
    ended = datetime.fromtimestamp(RunDir(folder).summary.stat().st_mtime)  # the summary's time: when the run ended
    return {"date": ended.strftime("%Y%m%d-%H%M%S"), "endpoint_type": settings.get("backend"),
            "backend": settings.get("backend"), "label": settings.get("strategy"), "model_id": settings.get("model"),
            "tokenizer_id": settings.get("model"), "num_prompts": summary.scheduled, "request_rate": rate,
            "burstiness": _burstiness(settings), "max_concurrency": _max_concurrency(settings)}


def _peaks(finished: pd.DataFrame, tokens: pd.DataFrame) -> dict:
    """vLLM's peak figures over one-second buckets from the first arrival: the most tokens emitted, and the
    most requests in flight (a request counts in every second from its arrival's to its completion's)."""
    if finished.empty:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = float(finished["arrival_time"].min())
    times = tokens.loc[tokens["request_id"].isin(finished["request_id"]), "time"].to_numpy(dtype="float64")
    per_s = np.bincount(np.floor(times - t0).clip(min=0).astype(np.int64)) if times.size else np.zeros(1)
    first = np.floor(finished["arrival_time"].to_numpy(dtype="float64") - t0).astype(np.int64)
    last = np.floor(finished["completion_time"].to_numpy(dtype="float64") - t0).astype(np.int64)
    edges = np.zeros(int(last.max()) + 2, dtype=np.int64)
    np.add.at(edges, first, 1)
    np.add.at(edges, last + 1, -1)
    return {"max_output_tokens_per_s": float(per_s.max()), "max_concurrent_requests": int(np.cumsum(edges).max())}


def _detailed(finished: pd.DataFrame, tokens: pd.DataFrame) -> dict:
    """The per-request lists `vllm bench serve --save-detailed` adds, over the finished requests in one order
    (times in s: start_times from the run's t0, itls each request's gaps between consecutive tokens)."""
    tok = tokens[tokens["request_id"].isin(finished["request_id"])].sort_values(["request_id", "token_index"])
    gaps = {rid: np.diff(t.to_numpy(dtype="float64")).tolist() for rid, t in tok.groupby("request_id")["time"]}
    return {"input_lens": finished["prompt_len"].astype(int).tolist(),
            "output_lens": finished["n_tokens"].astype(int).tolist(),
            "ttfts": finished["ttft"].astype("float64").tolist(),
            "itls": [gaps.get(rid, []) for rid in finished["request_id"]],
            "start_times": finished["arrival_time"].astype("float64").tolist(),
            "errors": [""] * len(finished)}


def vllm_result(folder: str | Path, detailed: bool = False) -> dict:
    """The run in `folder` under vLLM bench serve's result keys and units (`detailed`: with the per-request
    lists of its --save-detailed)."""
    run, summary = RunDir(folder), read_summary(folder)
    requests = request_metrics(pd.read_parquet(run.table("requests")))
    finished = requests[requests["status"] == "finished"]
    tokens = pd.read_parquet(run.table("tokens"), columns=["request_id", "token_index", "time"])
    duration_s = summary.window_s
    per_s = 1.0 / duration_s if duration_s > 0 else float("nan")
    n_in, n_out = int(finished["prompt_len"].sum()), int(finished["n_tokens"].sum())
    result = _setup(run.path, summary) | {
        "duration": duration_s, "completed": len(finished), "failed": summary.failed,
        "total_input_tokens": n_in, "total_output_tokens": n_out, "request_throughput": summary.requests_per_s,
        "request_goodput": summary.goodput.met * per_s if summary.goodput else None,
        "output_throughput": summary.throughput_tok_s, "total_token_throughput": (n_in + n_out) * per_s,
        "latencies": finished["e2e"].astype("float64").tolist(),
        "queue_times": finished["queue_wait"].astype("float64").tolist(),
    } | _peaks(finished, tokens)
    itl = inter_token_latencies(tokens, finished["request_id"]).to_numpy(dtype="float64")
    for name, column in METRICS.items():
        values = itl if name == "itl" else finished[column].to_numpy(dtype="float64")
        result |= _stats(name, values)
    result |= _detailed(finished, tokens) if detailed else {}
    return result | {"batchlab_version": batchlab_version()["version"],
                     "batchlab_strategy_args": summary.settings.get("strategy_args"),
                     "batchlab_definitions": DEFINITIONS}


def save_result(folder: str | Path, path: str | Path | None = None, detailed: bool = False) -> Path:
    """Write vllm_result() of the run in `folder` to `path` (default: the folder's vllm_result.json)."""
    path = Path(path) if path else RunDir(folder).vllm_result
    result = vllm_result(folder, detailed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                             for k, v in result.items()})
    return path


def point_result(folder: str | Path) -> Path | None:
    """A sweep point's vllm_result.json; a run whose tables cannot be read keeps its point without one,
    with vllm_result.error.txt saying why."""
    try:
        return save_result(folder)
    except (OSError, ValueError, KeyError) as exc:
        RunDir(folder).vllm_result_error.write_text(f"{type(exc).__name__}: {exc}\n")
        return None
