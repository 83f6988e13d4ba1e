"""Metric formulas over the run's tables: pure functions (numpy/pandas only, no zmq, no protocol).

The live collector, the report and the discrete-event simulator all call these on tables with the
same columns. Every time is in seconds since the run's t0; latency is measured from the *planned*
arrival time, and failed requests stay in the tables (they count as SLO misses).
"""
import numpy as np
import pandas as pd

from batchlab.protocol.settings import SLO_NAMES, parse_slos  # noqa: F401  (the report reads them here)

NOT_SENT = "not sent: traffic stopped before its planned time"
NO_TERMINAL = "no terminal record: run ended before it completed"
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "queue_wait")
LATENCY_STATS = ("mean", "p50", "p90", "p99")  # each latency metric's summary


def request_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of a requests table with queue_wait, ttft, tpot and e2e (s) derived from its times."""
    out = df.copy()
    out["queue_wait"] = out["scheduled_time"] - out["arrival_time"]
    out["ttft"] = out["first_token_time"] - out["arrival_time"]
    decode_steps = out["output_len"].astype("float64") - 1.0
    decode_s = out["completion_time"] - out["first_token_time"]
    out["tpot"] = (decode_s / decode_steps).where(decode_steps > 0, np.nan)
    out["e2e"] = out["completion_time"] - out["arrival_time"]
    return out


def useful_fraction(output_lens: list[int]) -> float:
    """Share of a static batch's decode slots doing useful work: Σo_i ÷ (B × max o_i)."""
    if not output_lens or max(output_lens) <= 0:
        return float("nan")
    return sum(output_lens) / (len(output_lens) * max(output_lens))


def percentiles(series: pd.Series, stats: tuple[str, ...] = LATENCY_STATS) -> dict:
    """The named statistics of the non-NaN values, in `stats` order (None each when there are none):
    "mean", "pNN" (the NN-th percentile) or "max_abs" (the largest magnitude)."""
    values = _numbers(series)
    if values.size == 0:
        return dict.fromkeys(stats)
    out = {"mean": values.mean(), "max_abs": max(abs(values.max()), abs(values.min()))}  # before the reorder
    ranks = [s for s in stats if s.startswith("p")]
    owned = values is not series  # a float64 array of the caller's is used as it is, not copied
    if ranks:  # in place on our own copy (a million-row ITL array is not copied again)
        out |= dict(zip(ranks, np.percentile(values, [float(s[1:]) for s in ranks], overwrite_input=owned)))
    return {s: float(out[s]) for s in stats}


def _numbers(series: object) -> np.ndarray:
    """The non-NaN numbers of `series`; a float64 array without NaN is returned as it is."""
    if isinstance(series, np.ndarray) and series.dtype == np.float64:
        nan = np.isnan(series)
        return series[~nan] if nan.any() else series
    return pd.to_numeric(pd.Series(series), errors="coerce").dropna().to_numpy(dtype="float64", copy=True)


def inter_token_latencies(tokens: pd.DataFrame, request_ids: pd.Series | None = None) -> pd.Series:
    """Consecutive token time differences (s) within each request (optionally only `request_ids`)."""
    if tokens.empty:
        return pd.Series(dtype="float64")
    tok = tokens if request_ids is None else tokens[tokens["request_id"].isin(request_ids)]
    tok = tok.sort_values(["request_id", "token_index"])
    gaps = tok["time"].diff()
    same_request = tok["request_id"].eq(tok["request_id"].shift())
    return gaps[same_request].reset_index(drop=True)


def submitted_mask(requests: pd.DataFrame) -> pd.Series:
    """Rows the scheduler received (schedule rows never sent are excluded)."""
    if "submitted" in requests.columns:
        return requests["submitted"].astype(bool)
    return requests["error"] != NOT_SENT


def window_s(requests: pd.DataFrame) -> float:
    """Seconds from the first submitted arrival to the last finished completion (0 if none)."""
    finished = requests[requests["status"] == "finished"]
    arrivals = requests.loc[submitted_mask(requests), "arrival_time"].dropna()
    last = finished["completion_time"].dropna()
    if arrivals.empty or last.empty:
        return 0.0
    return max(float(last.max() - arrivals.min()), 0.0)


def goodput(requests: pd.DataFrame, slos: dict) -> dict:
    """Share of ALL submitted requests that finished and meet every SLO (failed ones are misses)."""
    df = request_metrics(requests)[submitted_mask(requests)]
    ok = df["status"] == "finished"
    for name, limit_s in slos.items():
        values = df[name]
        if name == "tpot":  # a one-token request has no decode step: nothing to miss
            values = values.where(df["output_len"] > 1, 0.0)
        ok &= values.le(limit_s)
    n = len(df)
    return {"slos": dict(slos), "met": int(ok.sum()), "submitted": n,
            "fraction": float(ok.sum() / n) if n else None}


def summarize(requests: pd.DataFrame, tokens: pd.DataFrame | None, settings: dict,
              slos: dict | None = None, *, itl: pd.Series | None = None) -> dict:
    """The run's headline numbers from its requests and tokens tables (or, instead of the tokens,
    the finished requests' inter-token gaps in request and token order: `itl`, a Series or a float64
    array)."""
    df = request_metrics(requests)
    finished = df[df["status"] == "finished"]
    failed = df[df["status"] != "finished"]
    span_s = window_s(df)
    out_tokens = int(finished["n_tokens"].sum())
    summary = {
        "scheduled": len(df), "submitted": int(submitted_mask(df).sum()),
        "finished": len(finished), "failed": len(failed),
        "failure_reasons": {str(k): int(v) for k, v in failed["error"].value_counts().items()},
        "output_tokens": out_tokens, "window_s": span_s,
        "throughput_tok_s": out_tokens / span_s if span_s > 0 else 0.0,
        "requests_per_s": len(finished) / span_s if span_s > 0 else 0.0,
    }
    if itl is None:
        itl = inter_token_latencies(tokens, finished["request_id"])
    for name in LATENCY_METRICS:
        summary[name] = percentiles(itl if name == "itl" else finished[name])
    summary["settings"] = dict(settings)
    if slos:
        summary["goodput"] = goodput(requests, slos)
    return summary
