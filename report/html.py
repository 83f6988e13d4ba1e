"""REPORT.html: one self-contained page (no network needed) beside REPORT.md.

Interactive curves (hover a point for its figures and failed share, click a legend entry to toggle a
strategy), the per-rate table, the one-line results and the setup. Page-side errors are collected into
the page itself (#page-errors), so a headless browser's DOM dump shows them.
"""
import html
import re
from pathlib import Path

from batchlab.report.external import DEFINITIONS, table_rows
from batchlab.report.html_curves import curves_html
from batchlab.report.output import write_text
from batchlab.report.stats import GroupStats
from batchlab.report.text import ms, p50_p99

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


def _external_table(external: list) -> str:
    if not external:
        return ""
    head = ("run", "tool", "rate req/s", "completed", "failed", "incomplete", "req/s", "out tok/s", "TTFT p50 / p99 ms",
            "E2E p50 / p99 ms")
    rows = table_rows(external, ("ttft", "e2e"), "–")
    notes = "".join(f"<li>{html.escape(kind)}: {html.escape(DEFINITIONS[kind])}.</li>"
                    for kind in sorted({p.kind for p in external}))
    return ("<h2>Other tools' runs</h2><p class='note'>Stars in the curves; their figures are the tool's own. "
            "Where the definitions differ from batchlab's:</p><ul class=\"note\" id=\"external-definitions\">"
            + notes + "</ul>" + _table(head, rows, "external"))


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
            "<h2>Results per rate</h2>", rate_tables(stats, rates), _external_table(external),
            "<h2>Setup</h2>", _list(setup, "setup"), '<pre id="page-errors" data-count="-1"></pre>']
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title>{ERRORS_JS}{STYLE}</head><body>" + "".join(body) + "</body></html>")
    return write_text(path, page)
