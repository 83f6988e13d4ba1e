"""A strategy's maximum throughput μ, measured directly: the completion rate of a run that keeps the worker
saturated (the closed loop with more clients than the worker has rows, so every batch can be full), over a
steady window (warm-up and drain excluded), with a 95% t-interval over the rates of BATCHES blocks of about
equal completions (batch means, since a batching worker's completions are autocorrelated); and μ pooled over
repeats, each run's rate one sample. Pure: tables in, numbers out. docs/capacity.md ("μ: the saturated run")
says why and how the blocks are cut.
"""
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from batchlab.collector.intervals import mean_interval

WARMUP_SHARE = 0.25  # of the traffic, excluded: the first batches form, caches and allocators warm up
BATCHES = 10  # blocks of the steady window (batch means)
EVENT_GAP_S = 1e-3  # completions closer than this are one event (one batch's rows, reported row by row)


def batch_means(series: np.ndarray, batches: int = BATCHES, weights: np.ndarray | None = None
                ) -> tuple[float, float, float]:
    """(mean, lo, hi): the series' (weighted) mean with a 95% t-interval over the (weighted) means of
    `batches` contiguous blocks, valid for an autocorrelated stationary series when a block is long against
    its correlation time."""
    series = np.asarray(series, dtype="float64")
    weights = np.ones_like(series) if weights is None else np.asarray(weights, dtype="float64")
    blocks = [float((series[i] * weights[i]).sum() / weights[i].sum())
              for i in np.array_split(np.arange(series.size), min(batches, series.size)) if i.size]
    mean = float((series * weights).sum() / weights.sum())
    half = mean_interval(np.array(blocks))[1]
    return mean, mean - half, mean + half


def _events(times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(event times, index of each event's first completion, completions per event) of sorted times."""
    first = np.flatnonzero(np.concatenate([[True], np.diff(times) > EVENT_GAP_S]))
    return times[first], first, np.diff(np.append(first, times.size))


@dataclass(slots=True)
class SaturatedRun:
    """One saturated run's completion rate over its steady window, with its batch-means interval."""

    repeat: int
    req_s: float
    req_s_lo: float
    req_s_hi: float
    tok_s: float
    tok_s_lo: float
    tok_s_hi: float
    window_s: list[float]  # [start, end] s since t0: the first and last completion of the steady window
    completions: int
    folder: str = ""


def saturated_run(requests: pd.DataFrame, duration_s: float, *, repeat: int = 0, folder: str = "",
                  warmup_share: float = WARMUP_SHARE, batches: int = BATCHES) -> SaturatedRun | None:
    """μ from a saturated run's requests table (times in s since t0; traffic sent until duration_s, then
    drained): the completions in [warmup_share × duration_s, duration_s], counted from the first of them to
    the last (so a static batch's completions, B at a time every T s, read exactly B / T); None with fewer
    than 2 distinct completion times there."""
    done = requests[requests["status"] == "finished"]
    times = done["completion_time"].to_numpy(dtype="float64")
    keep = (times >= warmup_share * duration_s) & (times <= duration_s)
    times, tokens = times[keep], done["n_tokens"].to_numpy(dtype="float64")[keep]
    order = np.argsort(times, kind="stable")
    times, tokens = times[order], tokens[order]
    if times.size < 2 or times[-1] <= times[0]:
        return None
    # completion events: rows ending within EVENT_GAP_S of each other are one (a batch's rows end together),
    # then up to `batches` blocks of about equal completions, each ending on an event: a block's rate is its
    # completions ÷ its span, so a worker that ends B requests every T s reads exactly B / T in every block
    event_times, first, counts = _events(times)
    event_tokens = np.add.reduceat(tokens, first)
    done_by = np.cumsum(counts) - counts[0]  # completions after the first event (the window's origin), by each
    tokens_by = np.cumsum(event_tokens) - event_tokens[0]
    # a block holds at least two of the largest events (two full batches), or its rate is one batch's luck
    blocks = max(min(batches, int(done_by[-1] // (2 * counts[1:].max()))), 2) if counts.size > 1 else 1
    targets = np.linspace(0, done_by[-1], blocks + 1)
    edges = np.unique(np.searchsorted(done_by, targets, side="left"))
    spans = np.diff(event_times[edges])
    req = batch_means(np.diff(done_by[edges]) / spans, spans.size, spans)
    tok = batch_means(np.diff(tokens_by[edges]) / spans, spans.size, spans)
    start, end = float(event_times[0]), float(event_times[-1])
    req, tok = (req[0], max(req[1], 0.0), req[2]), (tok[0], max(tok[1], 0.0), tok[2])  # a rate is never < 0
    completions = int(done_by[-1])
    return SaturatedRun(repeat, *req, *tok, [start, end], completions, folder)


def pooled(runs: list[SaturatedRun]) -> dict | None:
    """capacity.json's `saturated` entry: every run, and μ with its interval: a t-interval over the runs'
    rates with 2 or more repeats (the spread between runs), else the one run's batch-means interval."""
    if not runs:
        return None
    entry: dict = {"runs": [asdict(r) for r in runs]}
    for unit in ("req_s", "tok_s"):
        values = np.array([getattr(r, unit) for r in runs])
        if len(runs) >= 2:
            mean, half = mean_interval(values)
            entry |= {unit: mean, f"{unit}_lo": mean - half, f"{unit}_hi": mean + half}
        else:
            entry |= {k: getattr(runs[0], k) for k in (unit, f"{unit}_lo", f"{unit}_hi")}
    entry["method"] = (f"95% t-interval over {len(runs)} repeats' saturated rates" if len(runs) >= 2 else
                       f"one run: 95% batch-means interval over up to {BATCHES} blocks of its steady window "
                       "(run-to-run variation not measured)")
    return entry
