"""Metric formulas over the run's tables: pure functions (numpy/pandas only, no zmq, no messages:
only protocol.status's enums).

The live collector, the report and the discrete-event simulator all call these on tables with the
same columns. Every time is in seconds since the run's t0; latency is measured from the *planned*
arrival time, and failed requests stay in the tables (they count as SLO misses).
"""
import math

import numpy as np
import pandas as pd

from batchlab.protocol.status import FailureReason, RequestStatus
from batchlab.stats.quantiles import exact_sum

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


def finished_p50(requests: pd.DataFrame) -> dict[str, float]:
    """TTFT p50 and E2E p50 (s) over a requests table's finished requests (request_metrics' columns; NaN with
    none): the figures a twin is drawn and judged by (report.twin's curves, lab.twin_curves' errors)."""
    done = requests[requests["status"] == RequestStatus.FINISHED]
    return {"ttft_p50": float(np.median(done["ttft"])) if len(done) else math.nan,
            "e2e_p50": float(np.median(done["e2e"])) if len(done) else math.nan}


def useful_fraction(output_lens: list[int]) -> float:
    """Share of a static batch's decode slots doing useful work: Σo_i ÷ (B × max o_i)."""
    if not output_lens or max(output_lens) <= 0:
        return float("nan")
    return sum(output_lens) / (len(output_lens) * max(output_lens))


def percentiles(series: pd.Series, stats: tuple[str, ...] = LATENCY_STATS) -> dict:
    """The named statistics of the non-NaN values, in `stats` order (None each when there are none):
    "mean" (from the exact sum, as quantiles.chunked_percentiles gives it for values on disk), "pNN"
    (the NN-th percentile) or "max_abs" (the largest magnitude)."""
    values = _numbers(series)
    if values.size == 0:
        return dict.fromkeys(stats)
    # before the reorder: the mean from the exact sum, the largest magnitude
    out = {"mean": exact_sum(values.tolist()) / len(values), "max_abs": max(abs(values.max()), abs(values.min()))}
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
    """Consecutive token time differences (s) within each request (optionally only `request_ids`). A tokens
    table is written in (request_id, token_index) order: sorted again only when it is not (numpy arrays, no
    frame copy: a run's millions of token rows)."""
    if tokens.empty:
        return pd.Series(dtype="float64")
    tok = tokens if request_ids is None else tokens[tokens["request_id"].isin(request_ids)]
    rid, index, times = (tok[c].to_numpy() for c in ("request_id", "token_index", "time"))
    same = rid[1:] == rid[:-1]
    if not np.all((rid[1:] > rid[:-1]) | (same & (index[1:] > index[:-1]))):
        order = np.lexsort((index, rid))
        rid, times = rid[order], times[order]
        same = rid[1:] == rid[:-1]
    return pd.Series(np.diff(times)[same], dtype="float64")


def submitted_mask(requests: pd.DataFrame) -> pd.Series:
    """Rows the scheduler received (schedule rows never sent are excluded)."""
    if "submitted" in requests.columns:
        return requests["submitted"].astype(bool)
    return requests["error"] != FailureReason.NOT_SENT


def goodput(requests: pd.DataFrame, slos: dict) -> dict:
    """Share of ALL submitted requests that finished and meet every SLO (failed ones are misses)."""
    met, n = _goodput_counts(request_metrics(requests), slos)
    return _goodput_result(slos, met, n)


def _goodput_counts(df: pd.DataFrame, slos: dict) -> tuple[int, int]:
    """(met, submitted) over a requests table that has its metric columns."""
    df = df[submitted_mask(df)]
    ok = df["status"] == RequestStatus.FINISHED
    for name, limit_s in slos.items():
        values = df[name]
        if name == "tpot":  # a one-token request has no decode step: nothing to miss
            values = values.where(df["output_len"] > 1, 0.0)
        ok &= values.le(limit_s)
    return int(ok.sum()), len(df)


def _goodput_result(slos: dict, met: int, n: int) -> dict:
    return {"slos": dict(slos), "met": met, "submitted": n, "fraction": met / n if n else None}


class RequestFigures:
    """summarize()'s figures over a requests table given whole or in slices (in request order, each
    request once): counts and extremes are folded as they come; the finished requests' latencies (8
    bytes each per metric) are kept for exact percentiles."""

    def __init__(self, slos: dict | None = None) -> None:
        self.slos = slos
        self.scheduled = self.submitted = self.finished = self.out_tokens = self.goodput_met = 0
        self.reasons: dict[str, int] = {}  # failed requests' errors, in first-seen order
        self.first_arrival, self.last_completion = math.inf, -math.inf  # s since t0
        self.latencies: dict[str, list[np.ndarray]] = {m: [] for m in LATENCY_METRICS if m != "itl"}

    def add(self, requests: pd.DataFrame) -> None:
        """Fold in one slice of the requests table."""
        df = request_metrics(requests)
        submitted = submitted_mask(df)
        is_finished = df["status"] == RequestStatus.FINISHED
        finished = df[is_finished]
        self.scheduled += len(df)
        self.submitted += int(submitted.sum())
        self.finished += len(finished)
        self.out_tokens += int(finished["n_tokens"].sum())
        for error, count in df.loc[~is_finished, "error"].value_counts(sort=False).items():
            self.reasons[str(error)] = self.reasons.get(str(error), 0) + int(count)
        arrivals = df.loc[submitted, "arrival_time"].dropna()
        last = finished["completion_time"].dropna()
        self.first_arrival = min(self.first_arrival, float(arrivals.min()) if len(arrivals) else math.inf)
        self.last_completion = max(self.last_completion, float(last.max()) if len(last) else -math.inf)
        for name, parts in self.latencies.items():
            parts.append(finished[name].to_numpy(dtype="float64"))
        if self.slos:
            self.goodput_met += _goodput_counts(df, self.slos)[0]

    def window_s(self) -> float:
        """window_s() of every slice added."""
        if math.isinf(self.first_arrival) or math.isinf(self.last_completion):
            return 0.0
        return max(self.last_completion - self.first_arrival, 0.0)

    def summary(self, settings: dict, itl: dict) -> dict:
        """The run's headline numbers; `itl`: the finished requests' inter-token gaps' percentiles()."""
        span_s = self.window_s()
        out = {
            "scheduled": self.scheduled, "submitted": self.submitted,
            "finished": self.finished, "failed": self.scheduled - self.finished,
            "failure_reasons": dict(sorted(self.reasons.items(), key=lambda kv: -kv[1])),
            "output_tokens": self.out_tokens, "window_s": span_s,
            "throughput_tok_s": self.out_tokens / span_s if span_s > 0 else 0.0,
            "requests_per_s": self.finished / span_s if span_s > 0 else 0.0,
        }
        for name in LATENCY_METRICS:
            out[name] = itl if name == "itl" else percentiles(np.concatenate(self.latencies[name] or [np.empty(0)]))
        out["settings"] = dict(settings)
        if self.slos:
            out["goodput"] = _goodput_result(self.slos, self.goodput_met, self.submitted)
        return out


def summarize(requests: pd.DataFrame, tokens: pd.DataFrame | None, settings: dict,
              slos: dict | None = None, *, itl: pd.Series | None = None) -> dict:
    """The run's headline numbers from its requests and tokens tables (or, instead of the tokens,
    the finished requests' inter-token gaps in request and token order: `itl`, a Series or a float64
    array)."""
    figures = RequestFigures(slos)
    figures.add(requests)
    if itl is None:
        finished = requests.loc[requests["status"] == RequestStatus.FINISHED, "request_id"]
        itl = inter_token_latencies(tokens, finished)
    return figures.summary(settings, percentiles(itl))
