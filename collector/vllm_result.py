"""A run's figures as `vllm bench serve --save-result` writes them: its keys, its units (ms, per s), its
meanings (vLLM 0.32's `vllm/benchmarks/serve.py`, `benchmark()` and `main_async()`).

Computed from batchlab's own tables (requests.parquet, tokens.parquet, summary.json), so a script
written for vLLM's result files reads a batchlab run unchanged; `batchlab_definitions` names where
batchlab's figures are defined differently from vLLM's. As vLLM's, the per-request lists cover every request
of the run in its order (a failed one too, with its error text), `burstiness` is always a number and `rtfx`
is there (0.0: no audio).
"""
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.collector.summary import Summary, read_summary
from batchlab.protocol.environment import batchlab_version
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.status import RequestStatus
from batchlab.stats.metrics import inter_token_latencies, request_metrics

Decode = Callable[[list[int]], str]  # token ids → text (the model's tokenizer; collector imports no model)
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
    "burstiness": "the gamma shape of the arrivals as vLLM's --burstiness: 1.0 for poisson, the shape for gamma, "
                  "Infinity for constant (vLLM's constant spacing); 1.0, vLLM's default, where it does not apply "
                  "(rate inf, the closed loop, a trace's own times)",
    "latencies": "each request's e2e, s, every request in id order (vLLM: each request's, from sending); 0.0 for a "
                 "failed one, as vLLM writes it",
    "queue_times": "each request's wait from arrival to being scheduled, s, every request in id order (vLLM: the "
                   "wait for a --max-concurrency slot); 0.0 where a request was never scheduled",
    "errors": "each request's error text, '' when it finished (with --save-detailed, as the other lists: input_lens, "
              "output_lens (0 for a failed one, as vLLM counts them), ttfts (0.0 before a first token), itls (its gaps "
              "between consecutive tokens, a failed one's up to its failure), start_times (its arrival, s from the "
              "run's t0) and generated_texts (its token ids decoded with the model's tokenizer))",
    "rtfx": "0.0: vLLM's inverse real-time factor of audio input, which batchlab runs have none of",
}


def _stats(name: str, values_s: np.ndarray) -> dict:
    """mean/median/std/pNN in ms, as vLLM computes them (0 for no values)."""
    v = values_s[~np.isnan(values_s)] if values_s.size else values_s
    v = v if v.size else np.zeros(1)
    out = {f"mean_{name}_ms": float(np.mean(v)) * 1e3, f"median_{name}_ms": float(np.median(v)) * 1e3,
           f"std_{name}_ms": float(np.std(v)) * 1e3}
    return out | {f"p{p}_{name}_ms": float(value) * 1e3 for p, value in zip(PERCENTILES, np.percentile(v, PERCENTILES))}


def _burstiness(settings: dict) -> float:
    """vLLM's burstiness: the gamma shape it draws every arrival from (1.0: Poisson; inf: constant spacing, its
    `burstiness == inf` branch); its default 1.0 where no rate is drawn (rate inf, the closed loop, a trace)."""
    rate = settings.get("rate")
    if settings.get("concurrency") or rate is None or (isinstance(rate, float) and not math.isfinite(rate)):
        return 1.0
    return {"constant": math.inf, "gamma": float(settings.get("burstiness") or 1.0)}.get(settings.get("arrival"), 1.0)


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


def _known(values: pd.Series) -> list[float]:
    """A per-request figure as vLLM lists it: 0.0 where the request never got that far (vLLM's default)."""
    return values.astype("float64").fillna(0.0).tolist()


def _texts(decode: Decode | None, ids: dict[int, list[int]], order: pd.Series) -> list[str | None]:
    """Each request's tokens decoded ("" for none); None each without a decoder."""
    if decode is None:
        return [None] * len(order)
    return [decode([t for t in ids.get(rid, []) if t >= 0]) for rid in order]


def _detailed(requests: pd.DataFrame, tokens: pd.DataFrame, decode: Decode | None) -> dict:
    """The per-request lists `vllm bench serve --save-detailed` adds, over every request in id order (times
    in s: start_times from the run's t0, itls each request's gaps between consecutive tokens)."""
    tok = tokens.sort_values(["request_id", "token_index"])
    gaps = {rid: np.diff(t.to_numpy(dtype="float64")).tolist() for rid, t in tok.groupby("request_id")["time"]}
    ids = {rid: t.astype("int64").tolist() for rid, t in tok.groupby("request_id")["token_id"]}
    finished = requests["status"] == RequestStatus.FINISHED
    return {"input_lens": requests["prompt_len"].astype(int).tolist(),
            "output_lens": requests["n_tokens"].where(finished, 0).astype(int).tolist(),
            "ttfts": _known(requests["ttft"]),
            "itls": [gaps.get(rid, []) for rid in requests["request_id"]],
            "start_times": _known(requests["arrival_time"]),
            "generated_texts": _texts(decode, ids, requests["request_id"]),
            "errors": requests["error"].where(~finished, "").astype(str).tolist()}


def vllm_result(folder: str | Path, detailed: bool = False, decode: Decode | None = None,
                why_not: str = "") -> dict:
    """The run in `folder` under vLLM bench serve's result keys and units (`detailed`: with the per-request
    lists of its --save-detailed; `decode` turns a request's token ids into its generated text, else
    generated_texts are null, `why_not` says why)."""
    run, summary = RunDir(folder), read_summary(folder)
    requests = request_metrics(pd.read_parquet(run.table("requests"))).sort_values("request_id", ignore_index=True)
    finished_rows = requests["status"] == RequestStatus.FINISHED
    finished = requests[finished_rows]
    columns = ["request_id", "token_index", "time", *(["token_id"] if detailed else [])]
    tokens = pd.read_parquet(run.table("tokens"), columns=columns)
    duration_s = summary.window_s
    per_s = 1.0 / duration_s if duration_s > 0 else float("nan")
    n_in, n_out = int(finished["prompt_len"].sum()), int(finished["n_tokens"].sum())
    result = _setup(run.path, summary) | {
        "duration": duration_s, "completed": len(finished), "failed": summary.failed,
        "total_input_tokens": n_in, "total_output_tokens": n_out, "request_throughput": summary.requests_per_s,
        "request_goodput": summary.goodput.met * per_s if summary.goodput else None,
        "output_throughput": summary.throughput_tok_s, "total_token_throughput": (n_in + n_out) * per_s,
        "latencies": requests["e2e"].where(finished_rows).astype("float64").fillna(0.0).tolist(),
        "queue_times": _known(requests["queue_wait"]),
    } | _peaks(finished, tokens) | {"rtfx": 0.0}
    itl = inter_token_latencies(tokens, finished["request_id"]).to_numpy(dtype="float64")
    for name, column in METRICS.items():
        values = itl if name == "itl" else finished[column].to_numpy(dtype="float64")
        result |= _stats(name, values)
    definitions = DEFINITIONS
    if detailed:
        result |= _detailed(requests, tokens, decode)
        if decode is None:
            definitions = DEFINITIONS | {"generated_texts": f"null: {why_not or 'no tokenizer was given'}"}
    return result | {"batchlab_version": batchlab_version()["version"],
                     "batchlab_strategy_args": summary.settings.get("strategy_args"),
                     "batchlab_definitions": definitions}


def _json_value(key: str, value: object) -> object:
    """A figure as JSON: a non-finite float is null, but for burstiness, which vLLM writes as Infinity."""
    if isinstance(value, float) and not math.isfinite(value) and key != "burstiness":
        return None
    return value


def save_result(folder: str | Path, path: str | Path | None = None, detailed: bool = False,
                decode: Decode | None = None, why_not: str = "") -> Path:
    """Write vllm_result() of the run in `folder` to `path` (default: the folder's vllm_result.json)."""
    path = Path(path) if path else RunDir(folder).vllm_result
    result = vllm_result(folder, detailed, decode, why_not)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {k: _json_value(k, v) for k, v in result.items()})
    return path


def point_result(folder: str | Path) -> Path | None:
    """A sweep point's vllm_result.json; a run whose tables cannot be read keeps its point without one,
    with vllm_result.error.txt saying why."""
    try:
        return save_result(folder)
    except (OSError, ValueError, KeyError) as exc:
        RunDir(folder).vllm_result_error.write_text(f"{type(exc).__name__}: {exc}\n")
        return None
