"""REPORT.html's plots as plotly figures (hover a point for its figures, click a legend entry to toggle a
strategy): the latency curves, the TTFT / E2E CDFs, the ITL histogram, the batch timeline and the batch size /
queue / arrival-rate panels, from the same numbers as the PNGs (report.plots). Each figure is an HTML fragment
without plotly's JavaScript, which the page inlines once."""
import math

import numpy as np
import pandas as pd

from batchlab.report import plots
from batchlab.report.points import Collection
from batchlab.report.stats import PANELS, GroupStats, finished_requests, share_text
from batchlab.report.text import figure, ms

CURVE_POINTS = 2_000  # a CDF's or a step line's points sent to the page at most (hovering needs no more)
MPL_COLORS = {"tab:blue": "#1f77b4", "tab:orange": "#ff7f0e", "tab:green": "#2ca02c", "tab:red": "#d62728",
              "tab:purple": "#9467bd", "tab:brown": "#8c564b", "tab:pink": "#e377c2", "tab:gray": "#7f7f7f",
              "tab:olive": "#bcbd22", "tab:cyan": "#17becf"}
PALETTE = tuple(MPL_COLORS.values())


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _fragment(fig, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def plotly_js() -> str:
    """plotly's JavaScript, to inline once in the page's head (no network needed)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _ms(seconds: float | None) -> str:
    return ms(seconds, "–", " ms")


def hover_text(g: GroupStats) -> str:
    """A curve point's hover box: its rate, throughput, latencies and failed share."""
    lat = g.latency
    lines = [f"<b>{g.label}</b> at λ = {g.rate:g} req/s ({g.repeats} repeat{'s' * (g.repeats != 1)})",
             f"throughput {g.throughput_tok_s:.1f} tok/s, {g.requests_per_s:.2f} req/s",
             f"TTFT p50 {_ms(lat['ttft']['p50'])}, p99 {_ms(lat['ttft']['p99'])}",
             f"TPOT p50 {_ms(lat['tpot']['p50'])}, ITL p50 {_ms(lat['itl']['p50'])}",
             f"E2E p50 {_ms(lat['e2e']['p50'])}, p99 {_ms(lat['e2e']['p99'])}",
             f"failed {g.failed_text()}"]
    if g.goodput is not None:
        lines.append(f"goodput {g.goodput:.1%}")
    return "<br>".join(lines)


def _external_text(p) -> str:
    lat = p.latency
    return "<br>".join([f"<b>{p.label}</b> ({p.kind}) at λ = {figure(p.rate, 'g')} req/s",
                        f"throughput {figure(p.throughput_tok_s, '.1f')} tok/s, "
                        f"{figure(p.requests_per_s, '.2f')} req/s",
                        f"TTFT p50 {_ms(lat['ttft']['p50'])}, p99 {_ms(lat['ttft']['p99'])}",
                        f"E2E p50 {_ms(lat['e2e']['p50'])}, p99 {_ms(lat['e2e']['p99'])}",
                        f"failed {p.failed} / {p.completed + p.failed} ({share_text(p.failed_share)})"])


def _strategy_traces(fig, stats: dict, labels: list[str]) -> None:
    """One line per strategy in each panel; one legend entry toggles it in all four."""
    import plotly.graph_objects as go

    for i, label in enumerate(labels):
        for k, (metric, q) in enumerate(PANELS):
            groups = sorted((g for (lb, _), g in stats.items() if lb == label and g.latency[metric][q] is not None),
                            key=lambda g: g.rate)
            if not groups:
                continue
            fig.add_trace(go.Scatter(
                x=[g.throughput_tok_s for g in groups], y=[g.latency[metric][q] * 1e3 for g in groups],
                mode="lines+markers", name=label, legendgroup=label, showlegend=k == 0,
                marker={"color": _color(i), "symbol": ["x" if g.failed_share > 0.05 else "circle" for g in groups],
                        "size": 9},
                line={"color": _color(i)}, text=[hover_text(g) for g in groups],
                hovertemplate="%{text}<extra></extra>"), row=k // 2 + 1, col=k % 2 + 1)


def _external_traces(fig, external: list) -> None:
    """Other tools' runs as stars, one legend entry each."""
    import plotly.graph_objects as go

    for j, p in enumerate(external):
        for k, (metric, q) in enumerate(PANELS):
            value = p.latency[metric][q]
            if value is None or math.isnan(p.throughput_tok_s):
                continue
            fig.add_trace(go.Scatter(
                x=[p.throughput_tok_s], y=[value * 1e3], mode="markers", name=f"{p.label} ({p.kind})",
                legendgroup=f"external-{j}", showlegend=k == 0,
                marker={"symbol": "star", "size": 15, "color": _color(j + 7)}, text=[_external_text(p)],
                hovertemplate="%{text}<extra></extra>"), row=k // 2 + 1, col=k % 2 + 1)


def curves_html(stats: dict, labels: list[str], external: list) -> str:
    """The four latency-against-throughput panels."""
    from plotly.subplots import make_subplots

    titles = [f"{m.upper()} {q}" for m, q in PANELS]
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=0.1, horizontal_spacing=0.08)
    _strategy_traces(fig, stats, labels)
    _external_traces(fig, external)
    fig.update_yaxes(type="log", title_text="ms")
    fig.update_xaxes(title_text="throughput (output tokens/s)", row=2)
    fig.update_layout(height=760, hovermode="closest", legend={"title": {"text": "click to toggle"}},
                      margin={"t": 60, "l": 60, "r": 20, "b": 50})
    return _fragment(fig, "curves")


def _thin(x: np.ndarray, y: np.ndarray, points: int = CURVE_POINTS) -> tuple[list, list]:
    """At most `points` evenly spaced points of a line (its last kept)."""
    if len(x) > points:
        keep = np.unique(np.append(np.linspace(0, len(x) - 1, points).astype(np.int64), len(x) - 1))
        x, y = x[keep], y[keep]
    return x.tolist(), y.tolist()


def cdfs_html(collection: Collection, stats: dict, rate: float) -> str:
    """TTFT and E2E CDFs of every strategy at one rate (repeats pooled, finished requests)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"TTFT CDF at λ = {rate:g} req/s",
                                                        f"E2E CDF at λ = {rate:g} req/s"])
    for i, (label, runs) in enumerate(collection.at_rate(rate).items()):
        df = pd.concat([finished_requests(r) for r in runs])
        name = plots.legend_label(label, stats.get((label, rate)))
        for k, metric in enumerate(("ttft", "e2e")):
            v = np.sort(df[metric].dropna().to_numpy()) * 1e3
            x, y = _thin(v, np.arange(1, v.size + 1) / max(v.size, 1))
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=label, showlegend=k == 0,
                                     line={"color": _color(i)},
                                     hovertemplate=f"{label}: %{{x:.1f}} ms, %{{y:.1%}} of finished<extra></extra>"),
                          row=1, col=k + 1)
    fig.update_xaxes(type="log", title_text="ms")
    fig.update_yaxes(title_text="share of finished requests", row=1, col=1)
    fig.update_layout(height=430, hovermode="closest", margin={"t": 40, "l": 60, "r": 20, "b": 50})
    return _fragment(fig, "latency-cdf")


def itl_html(collection: Collection, stats: dict, rate: float) -> str:
    """Every inter-token gap at one rate: a histogram per strategy on log bins."""
    import plotly.graph_objects as go

    bins, counts = plots.itl_histograms(collection, rate)
    fig = go.Figure()
    for i, (label, (n_gaps, hist)) in enumerate(counts.items()):
        edges = bins * 1e3
        fig.add_trace(go.Scatter(
            x=np.repeat(edges, 2)[1:-1].tolist(), y=np.repeat(hist, 2).tolist(), mode="lines",
            name=plots.legend_label(f"{label} ({n_gaps} gaps)", stats.get((label, rate))),
            line={"color": _color(i)}, hovertemplate=f"{label}: %{{y}} gaps near %{{x:.2f}} ms<extra></extra>"))
    fig.update_xaxes(type="log", title_text="inter-token latency (ms)")
    fig.update_yaxes(title_text="gaps")
    fig.update_layout(title=f"ITL distribution at λ = {rate:g} req/s (all gaps, tokens.parquet)", height=430,
                      margin={"t": 50, "l": 60, "r": 20, "b": 50})
    return _fragment(fig, "itl-distribution")


def timeline_html(collection: Collection, rate: float) -> str:
    """One row per strategy; a bar per batch (colored by launch reason) or step, its thickness ∝ its size."""
    import plotly.graph_objects as go

    runs = [repeats[0] for repeats in collection.at_rate(rate).values()]
    t0, t1 = plots.window(runs) if runs else (0.0, plots.WINDOW_S)
    acts = [a[(a["end"] >= t0) & (a["start"] <= t1)] for a in map(plots.activity, runs)]
    top, fig, shown = plots.shared_scale(acts), go.Figure(), set()
    for row, (run, act) in enumerate(zip(runs, acts)):
        for reason, part in act.groupby("reason", sort=True):
            color = MPL_COLORS[plots.REASON_COLORS.get(reason, plots.OTHER_COLOR)]
            fig.add_trace(go.Bar(
                y=[run.label] * len(part), x=(part["end"] - part["start"]).tolist(), base=part["start"].tolist(),
                width=plots.bar_heights(part, top).tolist(), orientation="h", name=str(reason),
                legendgroup=str(reason), showlegend=reason not in shown, marker={"color": color},
                customdata=part["size"].tolist(),
                hovertemplate=f"{run.label}: {reason}, size %{{customdata}}, %{{base:.3f}} s + %{{x:.3f}} s"
                              "<extra></extra>"))
            shown.add(reason)
    fig.update_xaxes(range=[t0, t1], title_text="time since the run's t0 (s)")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Batches (static) and steps (continuous) at λ = {rate:g} req/s; bar thickness ∝ "
                            f"batch size (largest: {top:g})", barmode="overlay",
                      legend={"title": {"text": "launch reason"}}, height=200 + 90 * max(len(runs), 1), margin={"t": 50, "l": 100, "r": 20, "b": 50})
    return _fragment(fig, "batch-timeline")


def load_html(collection: Collection, rate: float) -> str:
    """Batch size (or running rows), queue length and arrival rate over the whole run, a line per strategy."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    bin_s = plots.MIN_RATE_BIN_S
    for i, (label, runs) in enumerate(collection.at_rate(rate).items()):
        act = plots.activity(runs[0]).sort_values("start")
        starts, rates, bin_s = plots.arrival_rate(runs[0].requests)
        lines = ((act["start"], act["size"]), plots.queue_length(runs[0].requests), (starts, rates))
        for k, (x, y) in enumerate(lines):
            xs, ys = plots.envelope(x, y, CURVE_POINTS)
            fig.add_trace(go.Scatter(x=xs.tolist(), y=ys.tolist(), mode="lines",
                                     line={"shape": "hv", "color": _color(i)}, name=label, legendgroup=label, showlegend=k == 0,
                                     hovertemplate=f"{label}: %{{y:g}} at %{{x:.2f}} s<extra></extra>"),
                          row=k + 1, col=1)
    for k, title in enumerate(("batch size / running rows", "queue length (requests)",
                               f"arrivals (req/s, {bin_s:.2g} s bins)")):
        fig.update_yaxes(title_text=title, row=k + 1, col=1)
    fig.update_xaxes(title_text="time since the run's t0 (s)", row=3, col=1)
    fig.update_layout(title=f"Batch size, queue length and arrival rate over time at λ = {rate:g} req/s (repeat 0)",
                      height=760, hovermode="closest", margin={"t": 50, "l": 70, "r": 20, "b": 50})
    return _fragment(fig, "batch-size-queue")
