"""A sweep: strategies × backends × rates × repeats, one real run per point, resumable.

Layout: OUT/sweep.json (the index), with automatic rates OUT/capacity.json, OUT/_probe/ and OUT/_capacity/
(each strategy's capacity search: lab.capacity_search), and
OUT/strategy=<label>/rate=<r>/repeat=<k>/ (one run each: collector.layout). A point is done when its point.json
exists, written only after its run returned: summary.json alone proves nothing, since the collector also writes
one for a run that failed or was interrupted. A failed point leaves FAILED.txt and is tried again on resume.

`repeats: {auto: {start, max, width_pct}}` (run_more_repeats): after the grid's first `start` repeats, one
more repeat at a time of the headline's comparisons (each strategy and naive at the headline's common load,
interleaved within a repeat) until every headline latency interval (TTFT p50 and E2E p50, percentage points
wide, from the spread between repeats) is at most width_pct and rests on at least MIN_REPEATS repeats, or
`max` repeats ran. Only the comparisons still too wide get another repeat; the rest of the grid keeps its
own. The headline's throughput comes from the capacity search's saturated runs, which have their own repeats.
"""
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from batchlab.protocol.outcomes import RunOutcome
from batchlab.collector.layout import (CAPACITY_DIR, CAPACITY_FILE, INDEX_FILE, PROBE_DIR, TWIN_DIR, WORKERS_DIR,
                                      point_dir)
from batchlab.lab.sweep_plan import Plan, Point, SweepError
from batchlab.lab.sweep_order import auto_rates, floor_3g, interleaved, plan_points, span_rates, warm_order
from batchlab.lab.disturbance import Disturbances
from batchlab.lab.progress import StudyProgress
from batchlab.lab.sweep_point import execute, load_text, preflight, refuse_old_layout, reused
from batchlab.lab.twin_curves import play_curves, twin_errors
from batchlab.protocol.files import write_json_atomic
from batchlab.report.headline import BASELINE, Headline
from batchlab.runner.pool import PoolKeeper, worker_key


def auto_capacity(plan: Plan, out: Path, pools: PoolKeeper | None, view,
                  disturbed: Disturbances | None = None, progress: StudyProgress | None = None
                  ) -> tuple[dict, list[float]]:
    """Every strategy's capacity searched live (OUT/capacity.json), and the rates placed from it."""
    from batchlab.lab.capacity_study import run_capacity

    doc = run_capacity(plan, out, plan.auto, pools, view, disturbed=disturbed, progress=progress)
    estimates = {lb: placing_rate(c) for lb, c in doc["strategies"].items()}
    known = [v for v in estimates.values() if v]
    if not known:
        raise SweepError("no strategy's capacity could be bracketed: every probe failed")
    if plan.auto.spanned and doc.get("method") == "twin":
        return doc, live_loads(known, plan.auto)
    if plan.auto.spanned:
        return doc, span_rates(known, plan.auto)
    wanted = plan.auto.probe or ("dynamic" if "dynamic" in estimates else plan.entries[0].label)
    if not estimates.get(wanted):
        raise SweepError(f"grid.rates.auto.probe: no capacity measured for a strategy labelled {wanted!r}")
    return doc, auto_rates(estimates[wanted], plan.auto.fractions)


def live_loads(capacities_req_s: list[float], auto) -> list[float]:
    """With a twin: the live grid's rates, `live_loads` × the lowest capacity, rounded down to 3 significant
    digits (0.8 stays at or below the headline's common load, 0.8 × the lower capacity of every comparison)."""
    lowest = min(capacities_req_s)
    return sorted({floor_3g(f * lowest) for f in auto.live_loads})


def placing_rate(c: dict) -> float | None:
    """The rate that places a strategy's knee among the grid's: its capacity estimate, else the highest rate
    it sustained, else its μ (no rate judged sustained: μ, not μ's upper bound, which a few noisy repeats can
    put orders of magnitude off), else the lowest rate not sustained."""
    return c["estimate_req_s"] or c["lo_req_s"] or (c.get("saturated") or {}).get("req_s") or c["hi_req_s"]


def _bracket_text(c: dict) -> str:
    lo, hi, sat = c["lo_req_s"], c["hi_req_s"], c.get("saturated")
    mu = f" (μ {sat['req_s']:.3g})" if sat else ""
    return f"[{'?' if lo is None else f'{lo:.3g}'}, {'?' if hi is None else f'{hi:.3g}'}]{mu}"


def run_sweep(plan: Plan, out: str | Path, *, resume: bool, view, source: str) -> dict:
    """Every point of the grid, skipping finished ones; returns the sweep.json index. Points that share their
    workers' settings run on the same warm workers (runner.pool): in the plan's order with every group's
    workers kept warm (interleaved), or group after group (grouped). `view`: its progress
    (lab.progress.CallbackView's methods); `source`: the YAML the plan came from ("" for none), for the index."""
    out_dir = Path(out)
    preflight(plan)
    refuse_old_layout(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in (PROBE_DIR, CAPACITY_DIR, TWIN_DIR):
            shutil.rmtree(out_dir / stale, ignore_errors=True)
        (out_dir / CAPACITY_FILE).unlink(missing_ok=True)
    mixed = interleaved(plan)
    disturbed = Disturbances.measured(plan.rerun_disturbed)
    progress = StudyProgress(view)
    if plan.auto:
        from batchlab.lab.capacity_study import plan_study

        plan_study(progress, plan, len(plan.entries))
    else:
        progress.plan("run", [float(plan.base.get("duration_s") or 0.0)] * (len(plan.entries) * len(plan.rates)
                                                                           * plan.repeats))
    with PoolKeeper(out_dir / WORKERS_DIR, keep_all=mixed) as pools:
        capacity, rates = (auto_capacity(plan, out_dir, pools, view, disturbed, progress) if plan.auto
                           else (None, plan.rates))
        if capacity:
            view.note("capacity (req/s): " + ", ".join(f"{lb} {_bracket_text(c)}" for lb, c in
                                                      capacity["strategies"].items()) + f" → rates {rates}")
        if capacity and capacity.get("method") == "twin":  # 3. the twin's curves, in virtual time
            play_curves(plan, out_dir, capacity, view)
        points = plan_points(plan, rates, out_dir)
        if not mixed:
            points = warm_order(points, plan.base, worker_key, first=plan.entries[-1].label if capacity else None)
        index = {"config": source, "base": plan.base, "rates": rates, "repeats": plan.repeats,
                 **({"concurrency": plan.concurrency} if plan.concurrency else {}),
                 "order": "interleaved" if mixed else "grouped",
                 "seed": plan.seed, "capacity": capacity, "points": [p.record(RunOutcome.PENDING) for p in points],
                 "entries": [{"label": e.label, **e.overrides} for e in plan.entries]}
        view.start(len(points))
        progress.plan("run", [float(point.config(plan.base).duration_s or 0.0) for point in points])
        for i, point in enumerate(points):
            index["points"][i] = _run_point(point, plan, pools, view, resume, disturbed=disturbed, progress=progress)
            index["reran"] = disturbed.reran
            write_json_atomic(out_dir / INDEX_FILE, index, default=str)
        if plan.repeats_auto:  # extra repeats of the headline's comparisons (run_more_repeats)
            index = run_more_repeats(plan, out_dir, index,
                                     lambda p: _run_point(p, plan, pools, view, resume, "repeat", disturbed,
                                                          progress),
                                     lambda doc: write_json_atomic(out_dir / INDEX_FILE,
                                                                   doc | {"reran": disturbed.reran}, default=str))
        if capacity and capacity.get("method") == "twin":  # 5. the twin against the live points
            twin_errors(out_dir, index, capacity, view)
    return index | {"reran": disturbed.reran}


def _run_point(point: Point, plan: Plan, pools: PoolKeeper, view, resume: bool, phase: str = "run",
               disturbed: Disturbances | None = None, progress: StudyProgress | None = None) -> dict:
    """The point run (or, on resume, its earlier record reused), again when a burst of other work disturbed
    it (`disturbed`: the sweep's Disturbances), shown as finished; its record."""
    def once() -> dict:
        return execute(point, plan.base, view.ticker(point, phase), plan.limits(), pools)

    name = f"{point.entry.label} {load_text(point, '')} rep {point.repeat}"
    started = time.monotonic()
    record = reused(point, plan.base, resume, view) or (disturbed.run(name, once, view) if disturbed else once())
    view.finished(point, record)
    if progress is not None:
        progress.ran(phase, time.monotonic() - started, float(point.config(plan.base).duration_s or 0.0))
    return record


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
