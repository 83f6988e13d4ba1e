"""A sweep: strategies × backends × rates × repeats, one real run per point, resumable.

Layout: OUT/sweep.json (the index), with automatic rates OUT/capacity.json, OUT/_probe/ and OUT/_capacity/
(each strategy's capacity search: lab.capacity_search), and
OUT/strategy=<label>/rate=<r>/repeat=<k>/ (one run each: collector.layout). A point is done when its point.json
exists, written only after its run returned: summary.json alone proves nothing, since the collector also writes
one for a run that failed or was interrupted. A failed point leaves FAILED.txt and is tried again on resume.
"""
import shutil
from pathlib import Path

from batchlab.collector.layout import CAPACITY_DIR, CAPACITY_FILE, INDEX_FILE, PROBE_DIR, WORKERS_DIR
from batchlab.lab.sweep_plan import (Plan, Point, SweepError, auto_rates, interleaved, load_plan, plan_points,
                                     span_rates, warm_order)
from batchlab.lab.sweep_point import QuietView, execute, preflight, refuse_old_layout, reused
from batchlab.protocol.files import write_json_atomic
from batchlab.runner.pool import PoolKeeper, worker_key


def auto_capacity(plan: Plan, out: Path, pools: PoolKeeper | None, view) -> tuple[dict, list[float]]:
    """Every strategy's capacity searched live (OUT/capacity.json), and the rates placed from it."""
    from batchlab.lab.capacity_search import run_capacity

    doc = run_capacity(plan, out, plan.auto, pools, view)
    estimates = {lb: c["estimate_req_s"] or c["lo_req_s"] or c["hi_req_s"] for lb, c in doc["strategies"].items()}
    known = [v for v in estimates.values() if v]
    if not known:
        raise SweepError("no strategy's capacity could be bracketed: every probe failed")
    if plan.auto.spanned:
        return doc, span_rates(known, plan.auto)
    wanted = plan.auto.probe or ("dynamic" if "dynamic" in estimates else plan.entries[0].label)
    if not estimates.get(wanted):
        raise SweepError(f"grid.rates.auto.probe: no capacity measured for a strategy labelled {wanted!r}")
    return doc, auto_rates(estimates[wanted], plan.auto.fractions)


def _bracket_text(c: dict) -> str:
    lo, hi, sat = c["lo_req_s"], c["hi_req_s"], c.get("saturated")
    mu = f" (μ {sat['req_s']:.3g})" if sat else ""
    return f"[{'?' if lo is None else f'{lo:.3g}'}, {'?' if hi is None else f'{hi:.3g}'}]{mu}"


def run_sweep(config: str, out: str, *, resume: bool = True, sets: dict | None = None, view=None) -> dict:
    """Every point of the grid, skipping finished ones; returns the sweep.json index. Points that share
    their workers' settings run on the same warm workers (runner.pool): in the plan's order with every
    group's workers kept warm (interleaved), or group after group (grouped). `sets`: --set overrides; `view`:
    its progress (sweep_point.QuietView's methods; none shown without one)."""
    view = view or QuietView()
    plan, out_dir = load_plan(config, sets), Path(out)
    preflight(plan)
    refuse_old_layout(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in (PROBE_DIR, CAPACITY_DIR):
            shutil.rmtree(out_dir / stale, ignore_errors=True)
        (out_dir / CAPACITY_FILE).unlink(missing_ok=True)
    mixed = interleaved(plan)
    with PoolKeeper(out_dir / WORKERS_DIR, keep_all=mixed) as pools:
        capacity, rates = auto_capacity(plan, out_dir, pools, view) if plan.auto else (None, plan.rates)
        if capacity:
            view.note("capacity (req/s): " + ", ".join(f"{lb} {_bracket_text(c)}" for lb, c in
                                                      capacity["strategies"].items()) + f" → rates {rates}")
        points = plan_points(plan, rates, out_dir)
        if not mixed:
            points = warm_order(points, plan.base, worker_key, first=plan.entries[-1].label if capacity else None)
        index = {"config": str(config), "base": plan.base, "rates": rates, "repeats": plan.repeats,
                 **({"concurrency": plan.concurrency} if plan.concurrency else {}),
                 "order": "interleaved" if mixed else "grouped",
                 "seed": plan.seed, "capacity": capacity, "points": [p.record("pending") for p in points],
                 "entries": [{"label": e.label, **e.overrides} for e in plan.entries]}
        view.start(len(points))
        for i, point in enumerate(points):
            index["points"][i] = _run_point(point, plan, pools, view, resume)
            write_json_atomic(out_dir / INDEX_FILE, index, default=str)
        if plan.repeats_auto:  # extra repeats of the headline's comparisons (lab.sweep_repeats)
            from batchlab.lab.sweep_repeats import run_more_repeats

            index = run_more_repeats(plan, out_dir, index, lambda p: _run_point(p, plan, pools, view, resume, "repeat"),
                                     lambda doc: write_json_atomic(out_dir / INDEX_FILE, doc, default=str))
    return index


def _run_point(point: Point, plan: Plan, pools: PoolKeeper, view, resume: bool, phase: str = "run") -> dict:
    """The point run (or, on resume, its earlier record reused), shown as finished; its record."""
    record = (reused(point, plan.base, resume, view)
              or execute(point, plan.base, view.ticker(point, phase), plan.limits(), pools))
    view.finished(point, record)
    return record
