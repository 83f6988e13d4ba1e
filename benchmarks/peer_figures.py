"""benchmarks/peer_check.py's pure parts: the schedule as a `vllm bench serve` timed_trace file, and both
tools' per-request figures under one definition (see peer_check's docstring), their ratios and table."""
import json
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.report.text import md_table

PROMPT_FIELD = "prompt_token_ids"  # the timed_trace field that carries each prompt's token ids


def export_timed_trace(frame: pd.DataFrame, path: Path) -> int:
    """Write the schedule as a timed_trace JSONL file, one JSON line per schedule row (arrival order):
    timestamp (s), input_length, output_length and the prompt's token ids under PROMPT_FIELD; the number
    of requests."""
    lines = []
    for offset, out_len, tokens in zip(frame["arrival_offset_s"].tolist(), frame["output_len"].tolist(),
                                       frame["prompt_tokens"].tolist()):
        ids = [int(t) for t in tokens]
        lines.append(json.dumps({"timestamp": float(offset), "input_length": len(ids),
                                 "output_length": int(out_len), PROMPT_FIELD: ids}) + "\n")
    path.write_text("".join(lines))
    return len(lines)


def _pct(values, q: float) -> float:
    a = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(a, q)) if a.size else float("nan")


def figures(ttft_s, tpot_s, e2e_s, completed: int, submitted: int, out_tok_s: float, **extra) -> dict:
    """The compared figures (ms, tok/s) from per-request seconds."""
    return {"completed": int(completed), "submitted": int(submitted),
            "ttft_p50_ms": 1e3 * _pct(ttft_s, 50), "ttft_p99_ms": 1e3 * _pct(ttft_s, 99),
            "tpot_p50_ms": 1e3 * _pct(tpot_s, 50), "tpot_p99_ms": 1e3 * _pct(tpot_s, 99),
            "e2e_p50_ms": 1e3 * _pct(e2e_s, 50), "output_tok_s": float(out_tok_s), **extra}


def sender_lag(start_times, offsets) -> np.ndarray:
    """Each request's send lateness (s) in a self-timed vllm bench run, estimated: its post time minus
    its planned offset, less the smallest such difference (the most punctual request defines time 0;
    vllm bench does not save its own origin)."""
    gap = np.asarray(start_times, dtype=float) - np.asarray(offsets, dtype=float)
    return gap - gap.min()


def bench_requests(result: dict, offsets=None) -> pd.DataFrame:
    """Per-request seconds from a `vllm bench serve --save-detailed` result: ttft, tpot, e2e; with the
    schedule's `offsets` also ttft_planned = ttft + the estimated sender lag (see sender_lag)."""
    n_all = len(result["ttfts"])
    lag = (sender_lag(result["start_times"], offsets) if offsets is not None and result.get("start_times")
           else np.full(n_all, np.nan))
    rows = []
    for ttft, itl, n, err, late in zip(result["ttfts"], result["itls"], result["output_lens"],
                                       result.get("errors") or [""] * n_all, lag):
        if err or not n:  # failed requests carry an error and no tokens
            continue
        decode = float(sum(itl))
        rows.append({"ttft": float(ttft), "tpot": decode / (n - 1) if n > 1 else np.nan,
                     "e2e": float(ttft) + decode, "output_len": int(n), "ttft_planned": float(ttft) + late})
    return pd.DataFrame(rows, columns=["ttft", "tpot", "e2e", "output_len", "ttft_planned"])


def bench_figures(results: list[dict], offsets=None) -> dict:
    """Figures over the pooled requests of one or more vllm bench results (of the same schedule,
    whose arrival `offsets` give ttft_planned)."""
    per = pd.concat([bench_requests(r, offsets) for r in results], ignore_index=True)
    return figures(per["ttft"], per["tpot"], per["e2e"], len(per), sum(r["num_prompts"] for r in results),
                   float(np.mean([r["output_throughput"] for r in results])),
                   ttft_planned_p50_ms=1e3 * _pct(per["ttft_planned"], 50),
                   ttft_planned_p99_ms=1e3 * _pct(per["ttft_planned"], 99))


def batchlab_requests(run_dir: Path) -> pd.DataFrame:
    """Finished rows of a batchlab run with ttft, tpot, e2e and ttft from dispatch (s)."""
    from batchlab.protocol.run_dir import RunDir
    from batchlab.stats.metrics import request_metrics

    df = request_metrics(pd.read_parquet(RunDir(run_dir).table("requests")))
    df["ttft_dispatch"] = df["first_token_time"] - df["scheduled_time"]
    return df


def batchlab_figures(run_dirs: list[Path]) -> dict:
    """Figures over the pooled finished requests of one or more batchlab runs; output tok/s: the mean of the
    runs' summary throughput_tok_s (stats.metrics: finished output tokens ÷ window_s)."""
    from batchlab.collector.summary import read_summary

    tok_s = [read_summary(d).throughput_tok_s for d in run_dirs]
    df = pd.concat([batchlab_requests(d) for d in run_dirs], ignore_index=True)
    done = df[df["status"] == "finished"]
    return figures(done["ttft"], done["tpot"], done["e2e"], len(done), len(df), float(np.mean(tok_s)),
                   ttft_dispatch_p50_ms=1e3 * _pct(done["ttft_dispatch"], 50),
                   ttft_dispatch_p99_ms=1e3 * _pct(done["ttft_dispatch"], 99))


def ratios(a: dict, b: dict) -> dict:
    """a ÷ b for every numeric figure both have."""
    return {k: (a[k] / b[k] if b[k] else float("nan")) for k in a
            if k in b and isinstance(a[k], (int, float)) and isinstance(b[k], (int, float))}


COLUMNS = [("completed", "done", "{:.0f}"), ("ttft_p50_ms", "TTFT p50 ms", "{:.1f}"),
           ("ttft_p99_ms", "TTFT p99 ms", "{:.1f}"), ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
           ("tpot_p99_ms", "TPOT p99 ms", "{:.1f}"), ("e2e_p50_ms", "E2E p50 ms", "{:.1f}"),
           ("output_tok_s", "out tok/s", "{:.1f}")]


def table(rows: list[tuple[str, dict]]) -> str:
    """A Markdown table of the compared figures."""
    cells = [[name, *(fmt.format(fig[k]) if isinstance(fig.get(k), (int, float)) else "-" for k, _, fmt in COLUMNS)]
             for name, fig in rows]
    return "\n".join(md_table(["tool", *(title for _, title, _ in COLUMNS)], cells))
