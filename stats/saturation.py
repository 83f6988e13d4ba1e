"""A strategy's maximum throughput μ, measured directly: the completion rate of a run that keeps the worker
saturated (the closed loop with more clients than the worker has rows, so every batch can be full), over a
steady window (warm-up and drain excluded), with a 95% t-interval over the rates of BATCHES blocks of about
equal completions (batch means, since a batching worker's completions are autocorrelated); and μ pooled over
repeats, each run's rate one sample. Pure: tables in, numbers out. docs/capacity.md ("μ: the saturated run")
says why and how the blocks are cut.
"""
import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from batchlab.protocol.status import RequestStatus
from batchlab.stats.intervals import log_interval, mean_interval

WINDOW, BUSY = "window", "busy"  # μ's two estimators a study measures (choose_estimator picks one)
WARMUP_SHARE = 0.25  # of the traffic, excluded: the first batches form, caches and allocators warm up
BATCHES = 10  # blocks of the steady window (batch means)
EVENT_GAP_S = 1e-3  # completions closer than this are one event (one batch's rows, reported row by row)


def batch_means(series: np.ndarray, batches: int = BATCHES, weights: np.ndarray | None = None,
                log: bool = False) -> tuple[float, float, float]:
    """(mean, lo, hi): the series' (weighted) mean with a 95% t-interval over the (weighted) means of
    `batches` contiguous blocks, valid for an autocorrelated stationary series when a block is long against
    its correlation time. `log` (positive series: rates): the interval from the spread of the blocks' logs,
    around the mean (lo = mean · e^−h, hi = mean · e^h), so that it never reaches zero."""
    series = np.asarray(series, dtype="float64")
    weights = np.ones_like(series) if weights is None else np.asarray(weights, dtype="float64")
    blocks = [float((series[i] * weights[i]).sum() / weights[i].sum())
              for i in np.array_split(np.arange(series.size), min(batches, series.size)) if i.size]
    mean = float((series * weights).sum() / weights.sum())
    if log and mean > 0 and min(blocks) > 0:
        half = mean_interval(np.log(blocks))[1]
        return mean, mean * math.exp(-half), mean * math.exp(half)
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
    interference: dict | None = None  # the other work beside the run (its summary's; None: not metered)
    busy: dict | None = None  # the same run's μ over the worker's busy time (busy_run's fields), None: not read

    @property
    def bounded(self) -> bool:
        """Whether this run bounds μ by either estimator: its window's interval, or its busy time's, is finite."""
        return math.isfinite(self.req_s_hi) or bool(self.busy and math.isfinite(self.busy["req_s_hi"]))

    def by(self, estimator: str) -> "SaturatedRun | None":
        """This run as `estimator` reads it ("window": itself; "busy": its busy-time figures), None: not read."""
        if estimator == WINDOW:
            return self
        if not self.busy:
            return None
        return SaturatedRun(**{**self.busy, "interference": self.interference, "folder": self.folder})


def saturated_run(requests: pd.DataFrame, duration_s: float, *, repeat: int = 0, folder: str = "",
                  warmup_share: float = WARMUP_SHARE, batches: int = BATCHES) -> SaturatedRun | None:
    """μ from a saturated run's requests table (times in s since t0; traffic sent until duration_s, then
    drained): the completions in [warmup_share × duration_s, duration_s] (or to the last request sent, when
    the traffic ended sooner), counted from the first of them to the last (so a static batch's completions,
    B at a time every T s, read exactly B / T); None with fewer than 2 distinct completion times there."""
    done = requests[requests["status"] == RequestStatus.FINISHED]
    times = done["completion_time"].to_numpy(dtype="float64")
    sent = requests["arrival_time"].to_numpy(dtype="float64") if "arrival_time" in requests else np.array([])
    sent = sent[np.isfinite(sent)]
    end = min(duration_s, float(sent.max())) if sent.size else duration_s  # a closed loop whose pool ran dry
    keep = (times >= warmup_share * duration_s) & (times <= end)
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
    req = batch_means(np.diff(done_by[edges]) / spans, spans.size, spans, log=True)
    tok = batch_means(np.diff(tokens_by[edges]) / spans, spans.size, spans, log=True)
    start, end = float(event_times[0]), float(event_times[-1])
    req, tok = (req[0], max(req[1], 0.0), req[2]), (tok[0], max(tok[1], 0.0), tok[2])  # a rate is never < 0
    completions = int(done_by[-1])
    return SaturatedRun(repeat, *req, *tok, [start, end], completions, folder)


READS = {WINDOW: "completions over each run's steady window",
         BUSY: "requests completed over the worker's busy time (its batches or steps)"}


def pooled(runs: list[SaturatedRun], estimator: str = WINDOW) -> dict | None:
    """capacity.json's `saturated` entry: every run, and μ with its interval: a t-interval over the runs'
    rates with 2 or more repeats (the spread between runs), else the one run's batch-means interval.
    `estimator`: how the runs read μ (WINDOW or BUSY), said in `method`."""
    if not runs:
        return None
    entry: dict = {"runs": [asdict(r) for r in runs], "estimator": estimator}
    for unit in ("req_s", "tok_s"):
        if len(runs) >= 2:
            mean, lo, hi = log_interval([getattr(r, unit) for r in runs])
            entry |= {unit: mean, f"{unit}_lo": lo, f"{unit}_hi": hi}
        else:
            entry |= {k: getattr(runs[0], k) for k in (unit, f"{unit}_lo", f"{unit}_hi")}
    entry["method"] = (f"geometric mean of {len(runs)} repeats' saturated rates ({READS[estimator]}), 95% "
                       "t-interval on their logs" if len(runs) >= 2 else
                       f"one run ({READS[estimator]}): 95% batch-means interval (on the log scale) over up to "
                       f"{BATCHES} blocks (run-to-run variation not measured)")
    return entry


def with_busy(run: SaturatedRun | None, busy: SaturatedRun | None) -> SaturatedRun | None:
    """`run` (the window's μ) carrying the busy-time μ of the same run beside it."""
    if run is not None and busy is not None:
        run.busy = {k: v for k, v in asdict(busy).items() if k not in ("interference", "busy", "folder")}
    return run


def choose_estimator(runs: dict[str, list[SaturatedRun]]) -> str:
    """The estimator a study's μ uses: BUSY where every run of every strategy has it and the strategies' pooled
    intervals (log width, summed) are narrower that way, else WINDOW. One for every strategy, so that a
    throughput ratio never sets one estimator against the other (docs/capacity.md, "Two estimators")."""
    def width(estimator: str) -> float:
        total = 0.0
        for rs in runs.values():
            read = [r.by(estimator) for r in rs]
            if not read or any(r is None for r in read):
                return math.inf
            sat = pooled(read)
            lo, hi = sat["req_s_lo"], sat["req_s_hi"]
            total += math.log(hi / lo) if lo > 0 and math.isfinite(hi) else math.inf
        return total

    return BUSY if runs and width(BUSY) < width(WINDOW) else WINDOW


def estimated(runs: list[SaturatedRun], estimator: str) -> list[SaturatedRun]:
    """The runs as `estimator` reads them (a run it cannot read is left out)."""
    return [r for r in (run.by(estimator) for run in runs) if r is not None]


def busy_run(requests: pd.DataFrame, batches: pd.DataFrame | None, steps: pd.DataFrame | None, duration_s: float,
             *, repeat: int = 0, folder: str = "", batches_per_block: int = 2) -> SaturatedRun | None:
    """μ from what the worker did: the requests its work units (a static batch, or a continuous worker's step)
    completed ÷ the time those units took, over the units from the first one that completed a request (the
    warm-up: a continuous worker's first rows are still prefilling) to the last that ended within the traffic,
    with a 95% batch-means interval (log scale) over blocks of at least `batches_per_block` of the largest
    units' completions. The time between units (the harness's turn) is left out; None without two units."""
    units = _units(batches, steps)
    if units is None:
        return None
    start, end, done = units
    keep = end <= duration_s
    start, end, done = start[keep], end[keep], done[keep]
    first = np.flatnonzero(done > 0)
    if first.size < 2:
        return None
    start, end, done = start[first[0] + 1:], end[first[0] + 1:], done[first[0] + 1:]  # after the first completer
    busy = end - start
    if busy.sum() <= 0 or done.sum() == 0:
        return None
    per_block = batches_per_block * max(int(done.max()), 1)
    blocks = max(min(BATCHES, int(done.sum() // per_block)), 1)
    cut = np.unique(np.searchsorted(np.cumsum(done), np.linspace(0, done.sum(), blocks + 1)[1:-1], side="left") + 1)
    pieces = [(d.sum(), b.sum()) for d, b in zip(np.split(done, cut), np.split(busy, cut)) if b.sum() > 0]
    rates, weights = np.array([d / b for d, b in pieces]), np.array([b for _, b in pieces])
    req = batch_means(rates, rates.size, weights, log=True)
    finished = requests[requests["status"] == RequestStatus.FINISHED]
    per_request = float(finished["n_tokens"].mean()) if len(finished) else 0.0
    tok = tuple(v * per_request for v in req)
    return SaturatedRun(repeat, *req, *tok, [float(start[0]), float(end[-1])], int(done.sum()), folder)


def _units(batches: pd.DataFrame | None, steps: pd.DataFrame | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(start, end, requests completed) of each of the worker's work units in time order: the steps of a
    continuous worker, else the static batches (each completes its size); None when there are none."""
    if steps is not None and len(steps):
        frame = steps.sort_values("start_time")
        return (frame["start_time"].to_numpy(dtype="float64"), frame["end_time"].to_numpy(dtype="float64"),
                frame["finished"].to_numpy(dtype="float64"))
    if batches is not None and len(batches):
        frame = batches.dropna(subset=["start_time", "completion_time"])
        frame = frame[~frame["oom"]].sort_values("start_time")
        return (frame["start_time"].to_numpy(dtype="float64"), frame["completion_time"].to_numpy(dtype="float64"),
                frame["size"].to_numpy(dtype="float64"))
    return None


def _window(tables, duration_s: float, **kw) -> SaturatedRun | None:
    return saturated_run(tables.requests, duration_s, **kw)


def _span(tables, duration_s: float, **kw) -> SaturatedRun | None:
    return saturated_run(tables.requests, duration_s, warmup_share=0.0, **kw)


def _busy(tables, duration_s: float, **kw) -> SaturatedRun | None:
    return busy_run(tables.requests, tables.batches, tables.steps, duration_s, **kw)


# μ's estimators, by name, over a run's tables (collector.tables.Tables or anything with requests, batches and
# steps): completions over the steady window after a quarter of warm-up (window), from the first completion
# (span), or over the worker's own busy time (busy). benchmarks/throughput_power.py compares them.
ESTIMATORS = {"window": _window, "span": _span, "busy": _busy}
