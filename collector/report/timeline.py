"""What the worker did over time: a Gantt of batches (static) or steps (continuous) per strategy for a
short window, and batch size and queue length over the whole run."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from batchlab.collector.report.plots import save  # noqa: E402
from batchlab.collector.report.points import Collection, RunData  # noqa: E402

WINDOW_S = 8.0  # the Gantt shows this much of the run, from its middle
REASON_COLORS = {"size": "tab:blue", "age": "tab:orange", "memory": "tab:green", "flush": "tab:red",
                 "credit": "tab:cyan", "step": "tab:purple"}  # the policies' launch reasons
OTHER_COLOR = "tab:gray"


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


def batch_timeline(collection: Collection, rate: float, path: Path) -> Path:
    """One row per strategy; a bar per batch (colored by launch reason) or step, height ∝ its size."""
    runs = [collection.group(lb, rate)[0] for lb in collection.labels() if collection.group(lb, rate)]
    t0, t1 = window(runs) if runs else (0.0, WINDOW_S)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.1 * max(len(runs), 1)))
    reasons = set()
    for row, run in enumerate(runs):
        act = activity(run)
        act = act[(act["end"] >= t0) & (act["start"] <= t1)]
        top = max(float(act["size"].max()), 1.0) if not act.empty else 1.0
        for rec in act.itertuples():
            height = 0.8 * rec.size / top
            ax.broken_barh([(rec.start, rec.end - rec.start)], (row - height / 2, height),
                           facecolors=REASON_COLORS.get(rec.reason, OTHER_COLOR), edgecolors="black",
                           linewidth=0.3)
            reasons.add(rec.reason)
    ax.set_yticks(range(len(runs)), [r.label for r in runs])
    ax.set_xlim(t0, t1)
    ax.set_xlabel("time since the run's t0 (s)")
    ax.set_title(f"Batches (static) and steps (continuous) at λ = {rate:g} req/s; bar height ∝ batch size")
    handles = [Patch(color=REASON_COLORS.get(r, OTHER_COLOR), label=r) for r in sorted(reasons)]
    if handles:
        ax.legend(handles=handles, title="launch reason", loc="upper right", fontsize=8)
    ax.invert_yaxis()
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


def load_over_time(collection: Collection, rate: float, path: Path) -> Path:
    """Batch size (or running rows) and queue length over the whole run, one line per strategy."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for label in collection.labels():
        runs = collection.group(label, rate)
        if not runs:
            continue
        act = activity(runs[0]).sort_values("start")
        top.step(act["start"], act["size"], where="post", label=label, linewidth=1)
        t, q = queue_length(runs[0].requests)
        bottom.step(t, q, where="post", label=label, linewidth=1)
    top.set_ylabel("batch size / running rows")
    bottom.set_ylabel("queue length (requests)")
    bottom.set_xlabel("time since the run's t0 (s)")
    top.set_title(f"Batch size and queue length over time at λ = {rate:g} req/s (repeat 0)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)
