"""Latency against throughput across rates, and latency distributions at one rate (matplotlib, Agg); a
closed-loop sweep's curves against the clients (--concurrency) instead of a rate."""
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from batchlab.collector.metrics import inter_token_latencies  # noqa: E402
from batchlab.report.external import figure  # noqa: E402
from batchlab.report.output import write_file  # noqa: E402
from batchlab.report.points import Collection  # noqa: E402
from batchlab.report.stats import FAILED_MARK_SHARE, GroupStats, finished_requests, share_text  # noqa: E402

DPI = 110
PANELS = (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p50"), ("e2e", "p99"))
FAILED_NOTE = ("Latencies cover finished requests only; labels give the failed share, "
               f"a red x marks > {FAILED_MARK_SHARE:.0%} failed.")


def save(fig, path: Path) -> Path:
    """Write (a PNG, through output.write_file) and close a figure."""
    fig.tight_layout()
    try:
        return write_file(path, lambda f: fig.savefig(f, dpi=DPI, format="png"))
    finally:
        plt.close(fig)


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
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
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
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
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
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series = {lb: pd.concat([inter_token_latencies(r.tokens) for r in runs]) * 1e3
              for lb, runs in collection.at_rate(rate).items()}
    values = pd.concat(series.values()) if series else pd.Series(dtype="float64")
    positive = values[values > 0]
    if not positive.empty:
        bins = np.geomspace(positive.min(), max(positive.max(), positive.min() * 1.01), 60)
        for label, s in series.items():
            ax.hist(s[s > 0], bins=bins, histtype="step",
                    label=legend_label(f"{label} ({len(s)} gaps)", stats.get((label, rate))))
        ax.set_xscale("log")
        ax.legend()
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("gaps")
    ax.set_title(f"ITL distribution at λ = {rate:g} req/s (all gaps, tokens.parquet)")
    return save(fig, path)


X_LABEL = "concurrency (clients)"


def latency_vs_concurrency(stats: dict[tuple[str, float], GroupStats], labels: list[str], path: Path) -> Path:
    """TTFT / E2E p50 and p99 panels and throughput against the clients, one line per strategy (a closed
    loop's run is keyed by its clients where an open loop's is keyed by its rate)."""
    fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(18, 4))
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
