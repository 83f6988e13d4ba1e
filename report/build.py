"""`batchlab report DIR`: load every run, compute the numbers, draw the plots, write REPORT.md."""
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.report.output import link_problems, write_text
from batchlab.report.points import Collection, ReportError, load_collection
from batchlab.protocol.errors import ConfigError, term
from batchlab.protocol.setting_groups import SLO_NAMES
from batchlab.protocol.setting_groups import parse_slos as parse_slo_items

REPORT_FILE = "REPORT.md"


@dataclass(slots=True)
class Report:
    """Where the report went (REPORT.md; REPORT.html and the plots beside it) and its one-line results."""

    path: Path
    plots: list[Path]
    headlines: list[str]
    capacity_lines: list[str] = field(default_factory=list)  # the capacity table as plain text
    machine_lines: list[str] = field(default_factory=list)  # the other work beside the runs, and its warning


ReportResult = Report  # its former name


def parse_slos(items: list[str]) -> dict[str, float]:
    """['ttft=500ms', 'tpot=50ms'] → {'ttft': 0.5, 'tpot': 0.05} (seconds); ReportError on a bad item."""
    try:
        return parse_slo_items(items)
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def checked_slos(slos: object) -> dict[str, float] | None:
    """A report's SLOs in seconds: {"ttft": 0.5} or ["ttft=500ms", ...]; ConfigError naming a bad one."""
    if slos is None:
        return None
    if isinstance(slos, (list, tuple, str)):
        try:
            return parse_slo_items(slos)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if not isinstance(slos, Mapping):
        raise ConfigError(f"{term('--slo', 'slos')} are a mapping (name → seconds) or ['NAME=VALUE', ...], "
                          f"not {slos!r:.60}")
    for name, value in slos.items():
        if name not in SLO_NAMES:
            raise ConfigError(f"{term('--slo', 'slos')}: no SLO named {name!r} (one of {', '.join(SLO_NAMES)})")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (0 < value < math.inf):
            raise ConfigError(f"{term('--slo', 'slos')}: {name} must be a number of seconds > 0, got {value!r}")
    return {str(k): float(v) for k, v in slos.items()}


def chosen_rate(collection: Collection, comparison_rate: float | None, wanted: float | None) -> float | None:
    """--rate if given (the nearest completed rate), else the headline's common load, else the middle rate."""
    rates = collection.rates()
    if not rates:
        return None
    if wanted is not None:
        return min(rates, key=lambda r: abs(r - wanted))
    return comparison_rate if comparison_rate is not None else rates[len(rates) // 2]


def run_report(folder: str, *, rate: float | None = None, slos: dict | None = None,
               out: str | None = None, extra: list[str] | None = None) -> Report:
    """Write the plots, REPORT.md and REPORT.html into `out` (default: `folder`); the runs' files are only
    read. `extra`: other tools' result files to place beside the strategies (with those found in the
    folder, report.external)."""
    from batchlab.report.external import load_external
    from batchlab.report.blocks import parse
    from batchlab.report.peer_section import blocks, section
    from batchlab.report import plots
    from batchlab.report.capacities import capacity_text, load_capacities
    from batchlab.report.headline import headlines
    from batchlab.report.html import HTML_FILE, write_html
    from batchlab.report.markdown import render
    from batchlab.report.setup import hardware
    from batchlab.report.stats import all_stats
    from batchlab.report.twin import PLOT_FILE as TWIN_PLOT
    from batchlab.report.twin import curves_plot as twin_plot
    from batchlab.report.twin import load_twin
    from batchlab.report.twin import section as twin_section

    collection = load_collection(folder)
    root = Path(out) if out else collection.root
    root.mkdir(parents=True, exist_ok=True)
    if links := link_problems(root):  # before anything is drawn: a refused report writes nothing
        raise ReportError(*links)
    stats = all_stats(collection, slos)
    hardware_of = {r.label: hardware(r.settings) for r in reversed(collection.runs)}
    capacities, source = ({}, "") if collection.closed_loop else load_capacities(collection, slos)  # by rate
    found = [] if collection.closed_loop else headlines(collection, capacities, hardware_of)  # capacity: by rate
    lines = [h.text for h in found]
    at = chosen_rate(collection, next((h.rate for h in found if h.rate is not None), None), rate)
    external = load_external(collection.root, extra)
    made = [plots.latency_vs_throughput(stats, collection.labels(), root / "latency_vs_throughput.png", external)]
    if collection.closed_loop:
        made.append(plots.latency_vs_concurrency(stats, collection.labels(), root / "latency_vs_concurrency.png"))
    if at is not None:
        made += [plots.latency_cdfs(collection, stats, at, root / "latency_cdf.png"),
                 plots.itl_distribution(collection, stats, at, root / "itl_distribution.png"),
                 plots.batch_timeline(collection, at, root / "batch_timeline.png"),
                 plots.load_over_time(collection, at, root / "batch_size_queue.png")]
    twin = load_twin(collection.root, capacities)
    drawn = twin_plot(twin, stats, root / TWIN_PLOT) if twin else None
    made += [drawn] if drawn else []
    body = render(collection, stats, lines, [p.name for p in made if p != drawn], at, slos, capacities, source,
                  twin_section(twin, drawn.name if drawn else None))
    text = body + "\n".join(section(external)) + ("\n" if external else "")
    write_text(root / REPORT_FILE, text)
    write_html(root / HTML_FILE, title=f"batchlab report: {collection.root}", parts=parse(body) + blocks(external),
               figures=interactive_figures(collection, stats, at, external))
    return Report(root / REPORT_FILE, made, lines, capacity_text(capacities) if capacities else [],
                  machine_lines(collection, capacities))


def interactive_figures(collection: Collection, stats: dict, at: float | None, external: list) -> dict:
    """Plot file name → a function drawing its interactive figure for REPORT.html (report.interactive)."""
    from batchlab.report import interactive as fig

    figures = {"latency_vs_throughput.png": lambda: fig.curves_html(stats, collection.labels(), external)}
    if at is not None:
        figures |= {"latency_cdf.png": lambda: fig.cdfs_html(collection, stats, at),
                    "itl_distribution.png": lambda: fig.itl_html(collection, stats, at),
                    "batch_timeline.png": lambda: fig.timeline_html(collection, at),
                    "batch_size_queue.png": lambda: fig.load_html(collection, at)}
    return figures


def machine_lines(collection: Collection, capacities: dict) -> list[str]:
    """The terminal's lines on the machine: the other work beside the runs, and the warning when it bent them."""
    from batchlab.report import machine

    grid = machine.summary_line(machine.of_runs(collection.runs), "grid runs")
    saturated = [f for fs in machine.saturated_of(capacities).values() for f in fs]
    lines = [line for line in (grid, machine.summary_line(saturated, "saturated runs")) if line]
    return lines + [w for w in [machine.warning(collection, capacities)] if w]
