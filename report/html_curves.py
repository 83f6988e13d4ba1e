"""The HTML report's interactive curves: latency against throughput per strategy (plotly, inlined)."""
import math

from batchlab.report.external_point import figure
from batchlab.report.stats import GroupStats, share_text

PANELS = (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p50"), ("e2e", "p99"))


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f} ms"


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


def _color(i: int) -> str:
    palette = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")
    return palette[i % len(palette)]


def curves_html(stats: dict, labels: list[str], external: list) -> str:
    """The four panels as an HTML fragment with plotly's JavaScript inlined (no network needed)."""
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
    return fig.to_html(full_html=False, include_plotlyjs=True, div_id="curves",
                       config={"displaylogo": False, "responsive": True})
