"""REPORT.html: one self-contained page (no network needed) beside REPORT.md.

Interactive curves (hover a point for its figures and failed share, click a legend entry to toggle a
strategy; plotly, inlined), the per-rate table, the one-line results and the setup. Page-side errors are collected into
the page itself (#page-errors), so a headless browser's DOM dump shows them.
"""
import html
import math
import re
from pathlib import Path

from batchlab.report.peer_section import Block, blocks
from batchlab.report.output import write_text
from batchlab.report.stats import PANELS, GroupStats, share_text
from batchlab.report.text import figure, ms, p50_p99

HTML_FILE = "REPORT.html"
ERRORS_JS = """<script>
window.__pageErrors = [];
window.addEventListener("error", function (e) { window.__pageErrors.push(String(e.message)); });
window.addEventListener("load", function () {
  var box = document.getElementById("page-errors");
  box.setAttribute("data-count", String(window.__pageErrors.length));
  box.textContent = window.__pageErrors.join("\\n");
});
</script>"""
STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 90%; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; } .note { color: #555; font-size: 90%; } #page-errors { display: none; }
</style>"""
COLUMNS = ("strategy", "repeats", "throughput tok/s", "requests/s", "TTFT p50 / p99 ms", "TPOT p50 ms",
           "ITL p50 ms", "E2E p50 / p99 ms", "failed", "goodput")


def _row(g: GroupStats) -> list[str]:
    lat = g.latency
    return [g.label, str(g.repeats), f"{g.throughput_tok_s:.1f}", f"{g.requests_per_s:.2f}",
            p50_p99(lat, "ttft", "–"), ms(lat["tpot"]["p50"], "–"), ms(lat["itl"]["p50"], "–"),
            p50_p99(lat, "e2e", "–"), g.failed_text(), "–" if g.goodput is None else f"{g.goodput:.1%}"]


def _table(head: list[str] | tuple, rows: list[list[str]], table_id: str) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def rate_tables(stats: dict, rates: list[float]) -> str:
    """One table per rate, a row per strategy."""
    parts = []
    for i, rate in enumerate(rates):
        groups = [g for g in stats.values() if g.rate == rate]
        parts.append(f"<h3>λ = {rate:g} req/s</h3>" + _table(COLUMNS, [_row(g) for g in groups], f"rate-{i}"))
    return "".join(parts)


def _block(b: Block) -> str:
    """One block of the other tools' section as HTML."""
    if b.rows is not None:
        return _table(b.head, b.rows, b.id)
    if b.items is not None:
        return f'<ul class="note" id="{b.id}">' + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>"
    if b.level:
        return f"<h{b.level}>{html.escape(b.text)}</h{b.level}>"
    return f"<p class='note'>{html.escape(b.text)}</p>"


def _external_section(external: list) -> str:
    """Other tools' runs: the blocks REPORT.md shows too (report.peer_section), nothing less."""
    return "".join(_block(b) for b in blocks(external))


def _plain(markdown_line: str) -> str:
    """A REPORT.md line as escaped HTML text (bullets, bold and code marks dropped)."""
    text = re.sub(r"^\s*-\s+", "", markdown_line).replace("**", "").replace("`", "")
    return html.escape(text)


def _list(lines: list[str], list_id: str) -> str:
    return f'<ul id="{list_id}">' + "".join(f"<li>{_plain(line)}</li>" for line in lines) + "</ul>"


def write_html(path: Path, *, title: str, headlines: list[str], stats: dict, labels: list[str],
               rates: list[float], setup: list[str], external: list | None = None) -> Path:
    """Write REPORT.html (the curves with plotly's JavaScript inlined)."""
    external = external or []
    body = [f"<h1>{html.escape(title)}</h1>", "<h2>Result</h2>",
            _list(headlines or ["No naive run completed at a rate another strategy completed."], "headline"),
            "<h2>Latency against throughput</h2>",
            "<p class='note'>Hover a point for its figures and failed share; click a strategy in the legend to "
            "hide or show it. Latencies cover finished requests only; an x marks points where more than 5% "
            "failed.</p>", curves_html(stats, labels, external),
            "<h2>Results per rate</h2>", rate_tables(stats, rates), _external_section(external),
            "<h2>Setup</h2>", _list(setup, "setup"), '<pre id="page-errors" data-count="-1"></pre>']
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title>{ERRORS_JS}{STYLE}</head><body>" + "".join(body) + "</body></html>")
    return write_text(path, page)


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
