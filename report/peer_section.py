"""The "Other tools' runs" section, built once as blocks (headings, paragraphs, tables, lists) that REPORT.md
and REPORT.html both render, so neither shows less than the other: each run's load, counts and rates, its
latencies in the column of batchlab's metric of the same definition (under the tool's own name where that
differs), every figure the tool's console printed with its value, the tool's own warnings, and the file's
figures shown nowhere else, by name."""
from batchlab.report.blocks import ReportBlock, markdown
from batchlab.report.external import DEFINITIONS
from batchlab.report.peer_point import POINT_METRICS, POINT_QUANTILES, ExternalPoint, Figure
from batchlab.report.text import figure, ms

TABLE_HEAD = ("run", "tool", "load as the tool set it", "rate req/s", "completed", "failed", "incomplete", "req/s",
              "out tok/s")
MISSING = "-"


def _named(point: ExternalPoint, metric: str, cell: str) -> str:
    """A latency cell with the tool's name for that figure where it differs from batchlab's."""
    name = point.names.get(metric)
    return f"{cell} (its {name})" if name and cell != f"{MISSING} / {MISSING}" else cell


def _p50_p99(point: ExternalPoint, metric: str) -> str:
    lat = point.latency[metric]
    return _named(point, metric, f"{ms(lat['p50'], MISSING)} / {ms(lat['p99'], MISSING)}")


def run_rows(points: list[ExternalPoint]) -> list[list[str]]:
    """Each point's cells (TABLE_HEAD), then each metric's p50 / p99 in ms."""
    return [[p.label, p.kind, p.load or MISSING, figure(p.rate, "g"), str(p.completed), str(p.failed),
             MISSING if p.incomplete is None else str(p.incomplete), figure(p.requests_per_s, ".2f"),
             figure(p.throughput_tok_s, ".0f" if p.throughput_tok_s >= 100 else ".3g"),
             *(_p50_p99(p, m) for m in POINT_METRICS)] for p in points]


def latency_rows(points: list[ExternalPoint]) -> list[list[str]]:
    """Each point's latencies in full: mean / p50 / p90 / p95 / p99 ms per metric."""
    return [[p.label, *(_named(p, m, " / ".join(ms(p.latency[m][q], MISSING) for q in POINT_QUANTILES))
                        for m in POINT_METRICS)] for p in points]


def value_text(value: float | str | None) -> str:
    """A figure as text: a count whole, others to 2 decimals (3 significant digits below 1)."""
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def figure_cells(fig: Figure) -> str:
    """'Mean 37.70, Mdn 31.40, p95 84.80' (a single unnamed value alone)."""
    return ", ".join(f"{k} {value_text(v)}".strip() for k, v in fig.values.items())


def figure_rows(points: list[ExternalPoint]) -> list[list[str]]:
    """Every figure each tool printed: run, the figure as the tool names it, its unit, its values."""
    return [[p.label, f.name, f.unit or MISSING, figure_cells(f)] for p in points for f in p.figures]


def blocks(points: list[ExternalPoint]) -> list[ReportBlock]:
    """The section's blocks ([] when there are no points)."""
    if not points:
        return []
    kinds = sorted({p.kind for p in points})
    out = [ReportBlock("Other tools' runs", 2),
           ReportBlock("Result files of other tools, drawn as stars in the latency plots. Their figures are the tool's "
                       "own, measured by it; latencies in ms as p50 / p99, '-' where the file has no such figure, "
                       "each in the column of batchlab's metric of the same definition, with the tool's name for it "
                       "where that differs. Where the definitions differ from batchlab's:"),
           ReportBlock(items=[f"{kind}: {DEFINITIONS[kind]}." for kind in kinds], id="external-definitions"),
           ReportBlock(head=(*TABLE_HEAD, *(m.upper() for m in POINT_METRICS)), rows=run_rows(points), id="external"),
           ReportBlock("Each run's latencies in full, ms (mean / p50 / p90 / p95 / p99; '-' where the file has none):"),
           ReportBlock(head=("run", *(m.upper() for m in POINT_METRICS)), rows=latency_rows(points),
                       id="external-latency"),
           ReportBlock("Every figure each tool printed on its console", 3),
           ReportBlock("As the tool names them, in its units, read from its file (a time in UTC):"),
           ReportBlock(head=("run", "figure", "unit", "values"), rows=figure_rows(points), id="external-figures")]
    warned = [f"{p.label}: {w}" for p in points for w in p.warnings]
    if warned:
        out += [ReportBlock("The tools' own warnings about these runs:"),
                ReportBlock(items=warned, id="external-warnings")]
    unplaced = [f"{p.label}: {', '.join(p.unplaced)}" for p in points if p.unplaced]
    if unplaced:
        out += [ReportBlock("Figures these files hold that the report does not show (read them in the file):"),
                ReportBlock(items=unplaced, id="external-unshown")]
    odd = [f"{p.source.name}: {field} (shown as '-')" for p in points for field in p.not_finite]
    if odd:
        out += [ReportBlock("⚠ Fields these files hold as inf or NaN where a figure belongs (not a measurement; each "
                            "cell that would show it says '-'):"), ReportBlock(items=odd, id="external-not-finite")]
    return out


def section(points: list[ExternalPoint]) -> list[str]:
    """REPORT.md lines: the external points' section ([] when there are none)."""
    return markdown(blocks(points))
