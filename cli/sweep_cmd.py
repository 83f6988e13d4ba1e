"""`batchlab sweep CONFIG`: strategies × backends × rates × repeats, one real run per point, resumable.

Layout: OUT/sweep.json (the index), with automatic rates OUT/capacity.json, OUT/_probe/ and OUT/_capacity/
(each strategy's capacity search: lab.capacity_search), and
OUT/strategy=<label>/rate=<r>/repeat=<k>/ (one run each: collector.layout). A point is done when its point.json
exists, written only after its run returned: summary.json alone proves nothing, since the collector also writes
one for a run that failed or was interrupted. A failed point leaves FAILED.txt and is tried again on resume.
"""
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.lab.fanout import ray_option
from batchlab.runner.pool import PoolKeeper, worker_key
from batchlab.lab.sweep_plan import (Plan, Point, SweepError, auto_rates, interleaved, load_plan, parse_sets,
                                     plan_points, span_rates, warm_order)
from batchlab.lab.sweep_point import execute, preflight, refuse_old_layout, reused
from batchlab.collector.layout import CAPACITY_DIR, CAPACITY_FILE, INDEX_FILE, PROBE_DIR, WORKERS_DIR
from batchlab.protocol.files import write_json_atomic


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


def run_sweep(config: str, out: str, *, resume: bool = True, sets: dict | None = None) -> dict:
    """Every point of the grid, skipping finished ones; returns the sweep.json index. Points that share
    their workers' settings run on the same warm workers (runner.pool): in the plan's order with every
    group's workers kept warm (interleaved), or group after group (grouped). `sets`: --set overrides."""
    from batchlab.cli.sweep_view import SweepView

    plan, out_dir = load_plan(config, sets), Path(out)
    preflight(plan)
    refuse_old_layout(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in (PROBE_DIR, CAPACITY_DIR):
            shutil.rmtree(out_dir / stale, ignore_errors=True)
        (out_dir / CAPACITY_FILE).unlink(missing_ok=True)
    mixed = interleaved(plan)
    with SweepView() as view, PoolKeeper(out_dir / WORKERS_DIR, keep_all=mixed) as pools:
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
    if record["status"] == "done":
        _show_figures(point, view)
    return record


def _show_figures(point: Point, view) -> None:
    """The point's measured figures under its line, as `run` shows them at its end (nothing when its summary
    cannot be read: the report names that point's fault)."""
    from batchlab.cli.result_table import point_line
    from batchlab.collector.summary import SummaryError, read_summary

    try:
        view.note(f"  {point_line(read_summary(point.folder))}")
    except (OSError, ValueError, SummaryError):
        pass


def sweep(config: Annotated[str, typer.Argument(help="sweep YAML (base: and grid:)")], *,
          out: Annotated[Optional[str], typer.Option(help="output folder")] = None,
          resume: Annotated[bool, typer.Option(help="skip points already done")] = True,
          set_: Annotated[Optional[list[str]], typer.Option(
              "--set", help="override a base setting, KEY=VALUE (a RunConfig name, e.g. duration_s=5), or a "
                            "grid key, grid.KEY=VALUE (e.g. grid.repeats=2); repeatable")] = None,
          ray: Annotated[Optional[str], ray_option(
              help="run the points on a Ray cluster (ADDRESS as RAY_ADDRESS: host:port, auto; "
                   "alone: a local Ray); see docs/ray.md")] = None,
          ray_cpus: Annotated[float, typer.Option(help="--ray: CPUs each point reserves")] = 1.0,
          ray_gpu_resource: Annotated[str, typer.Option(
              help="--ray: the resource GPUs are counted in")] = "GPU",
          ray_shared: Annotated[bool, typer.Option(
              help="--ray: --out is on storage every node sees at the same path")] = False) -> None:
    """Run a grid of strategies × backends × rates × repeats, one real run per point."""
    from batchlab.cli import resumable

    out = out or str(Path("results") / Path(config).stem)
    with resumable(out):
        if ray is not None:
            from batchlab.lab.ray_sweep import RayOptions, run_ray_sweep

            opts = RayOptions(ray, ray_cpus, ray_gpu_resource, ray_shared)
            from batchlab.cli.sweep_view import SweepView

            with SweepView() as view:
                index = run_ray_sweep(config, out, opts, resume=resume, sets=parse_sets(set_), view=view)
        else:
            index = run_sweep(config, out, resume=resume, sets=parse_sets(set_))
    statuses = [p["status"] for p in index["points"]]
    ok = len(statuses) - statuses.count("failed")
    typer.echo(f"sweep in {out}: {ok} of {len(statuses)} points done, {statuses.count('failed')} failed "
               f"(see {Path(out) / INDEX_FILE})")
    if ok == 0:
        raise typer.Exit(code=1)
    _end_report(out)


def _end_report(out: str) -> None:
    """The capacity table and headline, as `batchlab report` prints them (its REPORT.md written too); a report
    that cannot be made is one line and exit 1, the sweep's runs kept."""
    from batchlab.cli.report_cmd import echo_report
    from batchlab.report.points import ReportError

    try:
        echo_report(out)
    except ReportError as exc:
        typer.echo(f"no report: {exc}; the runs are in {out} (batchlab report {out} tries again)", err=True)
        raise typer.Exit(code=1) from None
