"""REPORT.html: the whole report on one self-contained page (no network needed), rendered from the blocks
REPORT.md is made of (report.blocks), so the page shows every heading, table, list and line the Markdown does.

Each plot is interactive where a person would hover or toggle (report.interactive: the latency curves, CDFs,
ITL histogram, batch timeline and queue panels; plotly's JavaScript inlined once); any other plot is the PNG
itself, inlined. Page-side errors are collected into the page (#page-errors), so a headless browser's DOM dump
shows them.
"""
import base64
import html
import re
from collections.abc import Callable
from pathlib import Path

from batchlab.report.blocks import ReportBlock
from batchlab.report.output import write_text

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
img { max-width: 100%; } code { background: #f3f3f3; padding: 0 .2em; }
</style>"""
# the id of the first list or table after a heading, where tests and readers look for it
IDS_AFTER = {"Capacity": "capacity", "Result": "headline", "Setup": "setup", "Confidence intervals": "ci",
             "Settings": "settings"}


def inline(text: str) -> str:
    """A Markdown line's text as HTML: escaped, with **bold** and `code` kept as such."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def _table(head: tuple[str, ...], rows: list[list[str]], table_id: str) -> str:
    cells = "".join(f"<th>{inline(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>'


def _image(b: ReportBlock, root: Path, figures: dict[str, Callable[[], str]]) -> str:
    """A plot: its interactive figure where there is one, else its PNG inlined."""
    if b.image in figures:
        return f'<div class="plot" data-plot="{html.escape(b.image)}">{figures[b.image]()}</div>'
    path = root / b.image
    if not path.is_file():
        return f"<p class='note'>(plot {html.escape(b.image)} was not drawn)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}">'


def _block(b: ReportBlock, root: Path, figures: dict) -> str:
    """One block as HTML."""
    if b.rows is not None:
        return _table(b.head, b.rows, b.id)
    if b.items is not None:
        return f'<ul id="{b.id}">' + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>"
    if b.image:
        return _image(b, root, figures)
    if b.level:
        return f"<h{b.level}>{inline(b.text)}</h{b.level}>"
    return f"<p>{inline(b.text)}</p>"


def with_ids(parts: list[ReportBlock]) -> list[ReportBlock]:
    """The blocks with an element id on each table and list that has none: the first after a known heading by
    its name (IDS_AFTER), a rate's table under 'Results per rate' as rate-0, rate-1, ..., others by position."""
    section, heading, rate_tables, n = "", "", 0, 0
    for b in parts:
        if b.level:
            heading = b.text
            section = b.text if b.level <= 2 else section
            continue
        if b.id or (b.rows is None and b.items is None):
            continue
        if heading in IDS_AFTER and not any(p.id == IDS_AFTER[heading] for p in parts):
            b.id = IDS_AFTER[heading]
        elif section == "Results per rate" and b.rows is not None:
            b.id, rate_tables = f"rate-{rate_tables}", rate_tables + 1
        else:
            b.id, n = f"block-{n}", n + 1
    return parts


def write_html(path: Path, *, title: str, parts: list[ReportBlock], figures: dict[str, Callable[[], str]]) -> Path:
    """Write REPORT.html: every block, each plot named in `figures` (file name → its interactive fragment)
    drawn by it, the others' PNGs (beside `path`) inlined."""
    from batchlab.report.interactive import plotly_js

    body = "".join(_block(b, path.parent, figures) for b in with_ids(parts))
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title>{ERRORS_JS}<script>{plotly_js()}</script>{STYLE}</head><body>"
            + body + '<pre id="page-errors" data-count="-1"></pre></body></html>')
    return write_text(path, page)
