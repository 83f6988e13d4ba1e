"""Each strategy's capacity for the report: the searched brackets (a sweep's sweep.json `capacity` entry,
or a `batchlab capacity` folder's capacity.json), else brackets derived from the grid's own rates with the
same sustain criterion (collector.capacity.from_runs); and the capacity table, in Markdown and as text."""
import json

from batchlab.collector.capacity import GOODPUT_MIN, SERVED_MIN, from_runs
from batchlab.collector.layout import CAPACITY_FILE
from batchlab.collector.report.points import Collection
from batchlab.collector.report.text import md_table

SEARCHED = "searched"  # a bracketing search measured it
FROM_GRID = "from the grid"  # the grid's fixed rates, judged with the same criterion


def load_capacities(collection: Collection, slos: dict | None = None) -> tuple[dict[str, dict], str]:
    """(label → capacity.json entry, how it was found); labels without a run are left out."""
    doc = collection.index.get("capacity")
    path = collection.root / CAPACITY_FILE
    if not doc and path.exists():
        doc = json.loads(path.read_text())
    if doc and doc.get("strategies"):
        return dict(doc["strategies"]), SEARCHED
    runs = {lb: [(r.rate, r.requests, float(r.settings.get("duration_s") or 0.0)) for r in collection.runs
                 if r.label == lb] for lb in collection.labels()}
    return {lb: from_runs(lb, rs, slos).as_dict() for lb, rs in runs.items() if rs}, FROM_GRID


def sig(value: float | None) -> str:
    """3 significant digits ('?' when missing)."""
    return "?" if value is None else f"{value:.3g}"


def bracket_text(c: dict, unit: str = "req_s") -> str:
    """'4.9 [4.6, 5.2]', '≥ 4.6 (no failing rate measured)' or '< 1.2 (no rate sustained)'."""
    lo, hi, est = c.get(f"lo_{unit}"), c.get(f"hi_{unit}"), c.get(f"estimate_{unit}")
    if lo is not None and hi is not None:
        return f"{sig(est)} [{sig(lo)}, {sig(hi)}]"
    if lo is not None:
        return f"≥ {sig(lo)} (no failing rate measured)"
    if hi is not None:
        return f"< {sig(hi)} (no rate sustained)"
    return f"not measured ({c['note']})" if c.get("note") and unit == "req_s" else "not measured"


def _probes_text(c: dict) -> str:
    return ", ".join(f"{p['rate_req_s']:g}{'✓' if p['sustained'] else '✗'}" for p in c.get("probes", []))


def capacity_rows(capacities: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """(strategy, req/s, tok/s, probes) per strategy."""
    return [(lb, bracket_text(c), bracket_text(c, "tok_s"), _probes_text(c)) for lb, c in capacities.items()]


def capacity_table(capacities: dict[str, dict]) -> list[str]:
    """The Markdown table: capacity in req/s and output tok/s, estimate [bracket], and the rates measured."""
    head = ["strategy", "capacity (req/s)", "capacity (output tok/s)", "rates measured (✓ sustained, ✗ not)"]
    return md_table(head, capacity_rows(capacities))


def capacity_text(capacities: dict[str, dict]) -> list[str]:
    """The same table as aligned plain text (the terminal)."""
    rows = [("strategy", "capacity req/s", "output tok/s")] + [r[:3] for r in capacity_rows(capacities)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def criterion_text(source: str) -> str:
    """How the capacities were found, in one sentence."""
    how = ("a bracketing search per strategy (geometric steps from a saturating burst, then bisection in log "
           "space)" if source == SEARCHED else "the sweep's own rates (no search ran: the bracket is as coarse "
           "as the grid)")
    return (f"Capacity = the highest arrival rate sustained: served ≥ {SERVED_MIN:.0%} of its requests, the "
            f"waiting queue not growing over the traffic's second half, and with SLOs goodput ≥ {GOODPUT_MIN:.0%}. "
            f"Found by {how}; shown as the bracket's geometric mean [highest rate sustained, lowest rate not "
            "sustained]: the bracket is the search's resolution, not a sampling interval. Output tok/s = req/s × "
            "the mean output tokens per finished request (every strategy replays the same requests).")
