"""What the worker did over time: a Gantt of batches (static) or steps (continuous) per strategy for a
short window, and batch size, queue length and the arrival rate over the whole run."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from batchlab.report.plots import save  # noqa: E402
from batchlab.report.points import Collection, RunData  # noqa: E402

WINDOW_S = 8.0  # the Gantt shows this much of the run, from its middle
REASON_COLORS = {"size": "tab:blue", "age": "tab:orange", "memory": "tab:green", "flush": "tab:red",
                 "credit": "tab:cyan", "step": "tab:purple"}  # the policies' launch reasons
OTHER_COLOR = "tab:gray"
RATE_BINS = 60  # the arrival-rate panel counts arrivals in about this many bins over the run
MIN_RATE_BIN_S = 0.1


def activity(run: RunData) -> pd.DataFrame:
    """start, end, size, reason of each batch (static) or step (continuous), non-OOM only."""
    if run.steps is not None and not run.steps.empty:
        s = run.steps
        return pd.DataFrame({"start": s["start_time"], "end": s["end_time"], "size": s["running"],
                             "reason": "step"})
    b = run.batches
    if b.empty:
        return pd.DataFrame(columns=["start", "end", "size", "reason"])
    b = b[~b["oom"]] if "oom" in b else b
    return pd.DataFrame({"start": b["start_time"], "end": b["completion_time"], "size": b["size"],
                         "reason": b["launch_reason"].astype(str)})


def window(runs: list[RunData]) -> tuple[float, float]:
    """WINDOW_S seconds around the middle of the planned traffic."""
    duration_s = max(float(r.settings.get("duration_s", WINDOW_S)) for r in runs)
    start = max(0.0, duration_s / 2 - WINDOW_S / 2)
    return start, start + WINDOW_S


ROW_HEIGHT = 0.8  # the tallest bar's height, in rows


def shared_scale(acts: list[pd.DataFrame]) -> float:
    """The largest batch size (or running rows) shown in any row: one scale for every row (≥ 1)."""
    return max([float(a["size"].max()) for a in acts if not a.empty] + [1.0])


def bar_heights(act: pd.DataFrame, top: float) -> pd.Series:
    """Each bar's height in rows: ROW_HEIGHT × size ÷ `top` (the shared scale)."""
    return ROW_HEIGHT * act["size"].astype("float64") / top


def _draw_scale(ax, top: float) -> None:
    """A size scale right of the first row: a bar of height ROW_HEIGHT labelled with `top`, ticks at 0 and ½."""
    trans = ax.get_yaxis_transform()  # x in axes fraction, y in rows
    lo, hi = ROW_HEIGHT / 2, -ROW_HEIGHT / 2  # row 0's bar spans -0.4 .. 0.4 (the y axis is inverted)
    ax.plot([1.015, 1.015], [lo, hi], transform=trans, color="black", linewidth=2, clip_on=False)
    for frac in (0.0, 0.5, 1.0):
        y = lo + (hi - lo) * frac
        ax.plot([1.01, 1.02], [y, y], transform=trans, color="black", linewidth=1, clip_on=False)
        ax.text(1.025, y, f"{top * frac:g}", transform=trans, va="center", fontsize=8, clip_on=False)
    ax.text(1.01, hi - 0.15, "batch size", transform=trans, fontsize=8, clip_on=False)


def batch_timeline(collection: Collection, rate: float, path: Path) -> Path:
    """One row per strategy; a bar per batch (colored by launch reason) or step, its height ∝ its size on
    one scale shared by every row (drawn right of the first row)."""
    runs = [repeats[0] for repeats in collection.at_rate(rate).values()]
    t0, t1 = window(runs) if runs else (0.0, WINDOW_S)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.1 * max(len(runs), 1)))
    acts = [a[(a["end"] >= t0) & (a["start"] <= t1)] for a in map(activity, runs)]
    top, reasons = shared_scale(acts), set()
    for row, act in enumerate(acts):
        for rec, height in zip(act.itertuples(), bar_heights(act, top)):
            ax.broken_barh([(rec.start, rec.end - rec.start)], (row - height / 2, height),
                           facecolors=REASON_COLORS.get(rec.reason, OTHER_COLOR), edgecolors="black",
                           linewidth=0.3)
            reasons.add(rec.reason)
    ax.set_yticks(range(len(runs)), [r.label for r in runs])
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time since the run's t0 (s)")
    ax.set_title(f"Batches (static) and steps (continuous) at λ = {rate:g} req/s; bar height ∝ batch size, "
                 "one scale for every row")
    handles = [Patch(color=REASON_COLORS.get(r, OTHER_COLOR), label=r) for r in sorted(reasons)]
    if handles:
        ax.legend(handles=handles, title="launch reason", loc="upper right", fontsize=8)
    ax.invert_yaxis()
    if runs:
        _draw_scale(ax, top)
    return save(fig, path)


def queue_length(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests waiting over time: +1 at each submitted arrival, −1 when its batch was scheduled."""
    sub = requests[requests["submitted"]] if "submitted" in requests else requests
    arrivals = sub["arrival_time"].dropna().to_numpy()
    launches = sub["scheduled_time"].dropna().to_numpy()
    times = np.concatenate([arrivals, launches])
    order = np.argsort(times, kind="stable")
    steps = np.concatenate([np.ones(arrivals.size), -np.ones(launches.size)])[order]
    return times[order], np.cumsum(steps)


def arrival_rate(requests: pd.DataFrame, bin_s: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """(bin starts, requests/s in each bin, bin_s) from every request's arrival time, from 0 on. By
    default up to RATE_BINS equal bins (at least MIN_RATE_BIN_S each) end at the last arrival, so no bin
    is cut short; a given bin_s makes bins of that width up to the bin holding the last arrival."""
    arrivals = np.clip(requests["arrival_time"].dropna().to_numpy(dtype=np.float64), 0.0, None)
    if arrivals.size == 0:
        return np.zeros(0), np.zeros(0), bin_s or MIN_RATE_BIN_S
    span_s = float(arrivals.max())
    if bin_s is None:
        n_bins = max(1, min(RATE_BINS, int(span_s // MIN_RATE_BIN_S)))
        bin_s = span_s / n_bins if span_s > 0 else MIN_RATE_BIN_S
    else:
        n_bins = int(span_s // bin_s) + 1
    counts = np.bincount(np.minimum(arrivals // bin_s, n_bins - 1).astype(np.int64), minlength=n_bins)
    return np.arange(n_bins) * bin_s, counts / bin_s, bin_s


def load_over_time(collection: Collection, rate: float, path: Path) -> Path:
    """Batch size (or running rows), queue length and arrival rate over the whole run, one line per
    strategy (a trace's bursts show in the arrival rate, and the queue they build beside it)."""
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    bin_s = MIN_RATE_BIN_S
    for label, runs in collection.at_rate(rate).items():
        act = activity(runs[0]).sort_values("start")
        top.step(act["start"], act["size"], where="post", label=label, linewidth=1)
        t, q = queue_length(runs[0].requests)
        middle.step(t, q, where="post", label=label, linewidth=1)
        starts, rates, bin_s = arrival_rate(runs[0].requests)
        bottom.step(starts, rates, where="post", label=label, linewidth=1)
    top.set_ylabel("batch size / running rows")
    middle.set_ylabel("queue length (requests)")
    bottom.set_ylabel(f"arrivals (req/s, {bin_s:.2g} s bins)")
    bottom.set_xlabel("time since the run's t0 (s)")
    top.set_title(f"Batch size, queue length and arrival rate over time at λ = {rate:g} req/s (repeat 0)")
    for ax in (top, middle, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)
