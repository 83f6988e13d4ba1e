"""Latency against throughput across rates, and latency distributions at one rate; a closed-loop sweep's
curves against the clients (--concurrency) instead of a rate. Each plot is drawn on a matplotlib Figure of its
own and saved as a PNG: pyplot, its figure registry and the caller's backend (a notebook's inline one) are
never touched.

What the worker did over time: a Gantt of batches (static) or steps (continuous) per strategy for a
short window, and batch size, queue length and the arrival rate over the whole run."""
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from batchlab.report.output import write_file
from batchlab.report.points import Collection, RunData
from batchlab.report.stats import FAILED_MARK_SHARE, PANELS, GroupStats, finished_requests, share_text
from batchlab.report.tokens import starts_of
from batchlab.report.text import figure

DPI = 110
FAILED_NOTE = ("Latencies cover finished requests only; labels give the failed share, "
               f"a red x marks > {FAILED_MARK_SHARE:.0%} failed.")


def subplots(nrows: int = 1, ncols: int = 1, **options):
    """(a new Figure, its axes), as pyplot.subplots gives them, but on a Figure no backend or registry knows."""
    figsize = options.pop("figsize", None)
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **options)


def save(fig: Figure, path: Path) -> Path:
    """Write a figure as a PNG (through output.write_file)."""
    fig.tight_layout()
    return write_file(path, lambda f: fig.savefig(f, dpi=DPI, format="png"))


def _error(g: GroupStats, metric: str, q: str, value: float) -> list[float]:
    ci = g.ci.get(f"{metric}_{q}")
    return [max(value - ci[0], 0.0), max(ci[1] - value, 0.0)] if ci else [0.0, 0.0]


def point_note(g: GroupStats) -> str:
    """A curve point's label: its rate, and its failed share when any request failed."""
    return f"λ={g.rate:g}" + (f", {share_text(g.failed_share)} failed" if g.failed else "")


def legend_label(label: str, g: GroupStats | None) -> str:
    """A distribution's legend entry: the strategy and how many of its requests the curve leaves out."""
    return label if g is None else f"{label} (failed {g.failed_text()})"


def _mark_failures(ax, groups: list[GroupStats], x: list[float], y: list[float]) -> None:
    """Cross out the points whose latency leaves out more than FAILED_MARK_SHARE of the requests."""
    bad = [(xi, yi) for g, xi, yi in zip(groups, x, y) if g.failed_share > FAILED_MARK_SHARE]
    if bad:
        ax.scatter(*zip(*bad), marker="x", s=90, color="red", zorder=5)


def _external(ax, points: list, metric: str, q: str) -> None:
    """Other tools' runs (report.external) as labelled stars."""
    for p in points:
        value = p.latency[metric][q]
        if value is not None and not np.isnan(p.throughput_tok_s):
            ax.scatter([p.throughput_tok_s], [value * 1e3], marker="*", s=160, zorder=6, label=f"{p.label} ({p.kind})")
            ax.annotate(f"λ={figure(p.rate, 'g')}", (p.throughput_tok_s, value * 1e3), textcoords="offset points",
                        xytext=(4, -10), fontsize=7)


def latency_vs_throughput(stats: dict[tuple[str, float], GroupStats], labels: list[str], path: Path,
                          external: list | None = None) -> Path:
    """Four panels (TTFT / E2E × p50 / p99) against throughput, one line per strategy, rates and failed
    shares marked; other tools' runs (`external`) as stars."""
    fig, axes = subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (metric, q) in zip(axes.flat, PANELS):
        _external(ax, external or [], metric, q)
        for label in labels:
            groups = sorted((g for (lb, _), g in stats.items()
                             if lb == label and g.latency[metric][q] is not None), key=lambda g: g.rate)
            if not groups:
                continue
            x = [g.throughput_tok_s for g in groups]
            y = [g.latency[metric][q] * 1e3 for g in groups]
            err = np.array([_error(g, metric, q, g.latency[metric][q]) for g in groups]).T * 1e3
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
            _mark_failures(ax, groups, x, y)
            for g, xi, yi in zip(groups, x, y):
                ax.annotate(point_note(g), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"{metric.upper()} {q} (95% order-statistic CI)")
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("throughput (output tokens/s)")
    axes[0][0].legend()
    fig.suptitle("Latency against throughput across arrival rates (the knee is where latency takes off)\n"
                 + FAILED_NOTE, fontsize=10)
    return save(fig, path)


def _cdf(ax, values: pd.Series, label: str) -> None:
    v = np.sort(values.dropna().to_numpy()) * 1e3
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)


def latency_cdfs(collection: Collection, stats: dict[tuple[str, float], GroupStats], rate: float,
                 path: Path) -> Path:
    """TTFT and E2E CDFs of every strategy at one rate (repeats pooled, finished requests), each legend
    entry with the failed share the curve leaves out."""
    fig, axes = subplots(1, 2, figsize=(11, 4.5))
    for label, runs in collection.at_rate(rate).items():
        df = pd.concat([finished_requests(r) for r in runs])
        for ax, metric in zip(axes, ("ttft", "e2e")):
            _cdf(ax, df[metric], legend_label(label, stats.get((label, rate))))
    for ax, metric in zip(axes, ("TTFT", "E2E")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric} (ms)")
        ax.set_ylabel("share of finished requests")
        ax.set_title(f"{metric} CDF at λ = {rate:g} req/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Latencies cover finished requests only; the legend gives what each curve leaves out",
                 fontsize=10)
    return save(fig, path)


def itl_distribution(collection: Collection, stats: dict[tuple[str, float], GroupStats], rate: float,
                     path: Path) -> Path:
    """Every inter-token gap from tokens.parquet at one rate: a histogram per strategy (log bins), each
    legend entry with its failed share."""
    fig, ax = subplots(figsize=(8, 4.5))
    bins, counts = itl_histograms(collection, rate)
    for label, (n_gaps, hist) in counts.items():
        ax.stairs(hist, bins * 1e3, label=legend_label(f"{label} ({n_gaps} gaps)", stats.get((label, rate))))
    if counts:
        ax.set_xscale("log")
        ax.legend()
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("gaps")
    ax.set_title(f"ITL distribution at λ = {rate:g} req/s (all gaps, tokens.parquet)")
    return save(fig, path)


ITL_BINS = 60


def itl_histograms(collection: Collection, rate: float) -> tuple[np.ndarray, dict[str, tuple[int, np.ndarray]]]:
    """(log bin edges in s, label → (its gaps, its counts per bin)) of every positive gap at one rate
    ({} when no run has one): the positive gaps' range a block at a time, then each label's counts."""
    digests = {lb: [r.token_digest() for r in runs] for lb, runs in collection.at_rate(rate).items()}
    ranges = [(p.min(), p.max()) for ds in digests.values() for d in ds for g in d.itl_chunks()
              if (p := g[g > 0]).size]
    if not ranges:
        return np.zeros(0), {}
    low, high = min(r[0] for r in ranges), max(r[1] for r in ranges)
    bins = np.geomspace(low, max(high, low * 1.01), ITL_BINS)
    return bins, {label: (sum(d.n_gaps for d in ds),
                          sum((np.histogram(g[g > 0], bins=bins)[0] for d in ds for g in d.itl_chunks()),
                              np.zeros(len(bins) - 1, np.int64)))  # a label with no gap: an empty line
                  for label, ds in digests.items()}


X_LABEL = "concurrency (clients)"


def latency_vs_concurrency(stats: dict[tuple[str, float], GroupStats], labels: list[str], path: Path) -> Path:
    """TTFT / E2E p50 and p99 panels and throughput against the clients, one line per strategy (a closed
    loop's run is keyed by its clients where an open loop's is keyed by its rate)."""
    fig, axes = subplots(1, len(PANELS) + 1, figsize=(18, 4))
    for label in labels:
        groups = sorted((g for (lb, _), g in stats.items() if lb == label), key=lambda g: g.rate)
        x = [g.rate for g in groups]
        for ax, (metric, q) in zip(axes, PANELS):
            points = [(xi, g.latency[metric][q] * 1e3) for xi, g in zip(x, groups) if g.latency[metric][q] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
            ax.set_title(f"{metric.upper()} {q} (ms)")
        axes[-1].plot(x, [g.throughput_tok_s for g in groups], marker="o", label=label)
    axes[-1].set_title("throughput (output tokens/s)")
    for ax in axes:
        ax.set_xlabel(X_LABEL)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle("Closed loop: latency is measured from when a client could send, so it hides the queueing an "
                 "open-loop arrival would see", fontsize=10)
    return save(fig, path)


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


def _bars(act: pd.DataFrame, row: int, heights: pd.Series) -> PolyCollection:
    """A row's bars as one collection (an artist per bar took tens of minutes for an echo run's steps, thousands
    a second): each from its start to its end, `heights` tall around the row, colored by its launch reason."""
    start, end = act["start"].to_numpy(float), act["end"].to_numpy(float)
    lo, hi = row - heights.to_numpy() / 2, row + heights.to_numpy() / 2
    corners = np.stack([np.column_stack(xy) for xy in ((start, lo), (start, hi), (end, hi), (end, lo))], axis=1)
    colors = [REASON_COLORS.get(reason, OTHER_COLOR) for reason in act["reason"]]
    return PolyCollection(corners, facecolors=colors, edgecolors="black", linewidths=0.3)


def batch_timeline(collection: Collection, rate: float, path: Path) -> Path:
    """One row per strategy; a bar per batch (colored by launch reason) or step, its height ∝ its size on
    one scale shared by every row (drawn right of the first row)."""
    runs = [repeats[0] for repeats in collection.at_rate(rate).values()]
    t0, t1 = window(runs) if runs else (0.0, WINDOW_S)
    fig, ax = subplots(figsize=(12, 1.2 + 1.1 * max(len(runs), 1)))
    acts = [a[(a["end"] >= t0) & (a["start"] <= t1)] for a in map(activity, runs)]
    top, reasons = shared_scale(acts), set()
    for row, act in enumerate(acts):
        ax.add_collection(_bars(act, row, bar_heights(act, top)))
        reasons.update(act["reason"])
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


PLOT_POINTS = 20_000  # a line's points drawn at most: a figure is ~1,000 pixels wide


def envelope(x: pd.Series, y: pd.Series, points: int = PLOT_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """A line of more than `points` points (x ascending) as, in each of points ÷ 4 equal x bins, its first,
    last, lowest and highest point, in x order: what the pixels show (a run's millions of steps cost ~0.5 KiB a
    point to draw)."""
    xs, ys = np.asarray(x, dtype="float64"), np.asarray(y, dtype="float64")
    if len(xs) <= points:
        return xs, ys
    n_bins, span = points // 4, xs[-1] - xs[0]
    bins = (np.minimum(((xs - xs[0]) / span * n_bins).astype(np.int64), n_bins - 1) if span > 0
            else np.zeros(len(xs), np.int64))
    starts = starts_of(bins)
    ends = np.append(starts[1:], len(xs))
    seg = np.repeat(np.arange(len(starts)), ends - starts)
    keep = [starts, ends - 1]
    for extreme, blank in ((np.minimum, np.inf), (np.maximum, -np.inf)):
        hit = ys == extreme.reduceat(np.where(np.isnan(ys), blank, ys), starts)[seg]
        keep.append(np.flatnonzero(hit)[np.unique(seg[hit], return_index=True)[1]])  # the first in its bin
    keep = np.unique(np.concatenate(keep))
    return xs[keep], ys[keep]


def load_over_time(collection: Collection, rate: float, path: Path) -> Path:
    """Batch size (or running rows), queue length and arrival rate over the whole run, one line per
    strategy (a trace's bursts show in the arrival rate, and the queue they build beside it)."""
    fig, (top, middle, bottom) = subplots(3, 1, figsize=(11, 9), sharex=True)
    bin_s = MIN_RATE_BIN_S
    for label, runs in collection.at_rate(rate).items():
        act = activity(runs[0]).sort_values("start")
        starts, rates, bin_s = arrival_rate(runs[0].requests)
        lines = ((act["start"], act["size"]), queue_length(runs[0].requests), (starts, rates))
        for ax, (x, y) in zip((top, middle, bottom), lines):
            ax.step(*envelope(x, y), where="post", label=label, linewidth=1)
    top.set_ylabel("batch size / running rows")
    middle.set_ylabel("queue length (requests)")
    bottom.set_ylabel(f"arrivals (req/s, {bin_s:.2g} s bins)")
    bottom.set_xlabel("time since the run's t0 (s)")
    top.set_title(f"Batch size, queue length and arrival rate over time at λ = {rate:g} req/s (repeat 0)")
    for ax in (top, middle, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)
