"""`repeats: {auto: {start, max, width_pct}}`: after the grid's first `start` repeats, one more repeat at a
time of the headline's comparisons (each strategy and naive at the headline's common load, interleaved
within a repeat) until every headline latency interval (TTFT p50 and E2E p50, percentage points wide, from
the spread between repeats) is at most width_pct and rests on at least MIN_REPEATS repeats, or `max`
repeats ran. Only the comparisons still too wide get another repeat; the rest of the grid keeps its own.
The headline's throughput comes from the capacity search's saturated runs, which have their own repeats."""
import math
from collections.abc import Callable
from pathlib import Path

from batchlab.lab.sweep_plan import Plan, Point
from batchlab.collector.layout import point_dir
from batchlab.report.headline import BASELINE, Headline


MIN_REPEATS = 3  # two repeats give the spread one degree of freedom: too rough an estimate to stop on


def width_pct(h: Headline) -> float | None:
    """The wider of the headline's TTFT p50 and E2E p50 intervals (percentage points); inf while fewer than
    MIN_REPEATS repeats back it (one repeat: no interval at all); None: not compared."""
    results = [r for r in (h.ttft, h.e2e) if r is not None]
    if not results:
        return None
    if any(r.clusters < MIN_REPEATS or not r.measured for r in results):
        return math.inf
    return max(r.hi - r.lo for r in results)


def _finite(width: float | None) -> float | None:
    """A width for sweep.json: None when there is none yet (too few repeats) or no comparison."""
    return width if width is not None and math.isfinite(width) else None


def current_headlines(out_dir: Path) -> list[Headline]:
    """The headline the report would state now, from the sweep folder as it stands."""
    from batchlab.report.capacities import load_capacities
    from batchlab.report.headline import headlines
    from batchlab.report.points import load_collection

    collection = load_collection(out_dir)
    return headlines(collection, load_capacities(collection)[0], {})


def wide(found: list[Headline], limit_pct: float) -> list[Headline]:
    """The comparisons measured at a common load whose interval is still wider than limit_pct."""
    return [h for h in found if h.rate is not None and (w := width_pct(h)) is not None and w > limit_pct]


def repeat_points(plan: Plan, found: list[Headline], repeat: int, out_dir: Path) -> list[Point]:
    """This repeat's points: each wide comparison's strategy and the baseline at its rate (no duplicates)."""
    by_label = {e.label: e for e in plan.entries}
    points: dict[Path, Point] = {}
    for h in found:
        for label in (BASELINE, h.label):
            folder = out_dir / point_dir(label, h.rate, repeat)
            points.setdefault(folder, Point(by_label[label], h.rate, repeat, plan.seed, folder))
    return list(points.values())


def run_more_repeats(plan: Plan, out_dir: Path, index: dict, run_point: Callable[[Point], dict],
                     save: Callable[[dict], None]) -> dict:
    """Repeats beyond plan.repeats while a headline interval is too wide; the index gains their points and
    a `repeats_auto` entry (the settings, the repeats run, each comparison's final width)."""
    settings = plan.repeats_auto
    repeat, found = plan.repeats, current_headlines(out_dir)
    while repeat < settings.max and (todo := wide(found, settings.width_pct)):
        for point in repeat_points(plan, todo, repeat, out_dir):
            index["points"].append(run_point(point))
            save(index)
        repeat, found = repeat + 1, current_headlines(out_dir)
    index["repeats"] = repeat
    index["repeats_auto"] = {**settings.model_dump(), "ran": repeat,
                             "width_pct_now": {h.label: _finite(width_pct(h)) for h in found}}
    save(index)
    return index
