"""A closed-loop sweep's curves: latency and throughput against the clients (--concurrency), not a rate."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from batchlab.report.plots import PANELS, save  # noqa: E402
from batchlab.report.stats import GroupStats  # noqa: E402

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
