"""`batchlab sweep CONFIG`: strategies × backends × rates × repeats, one real run per point, resumable.

Layout: OUT/sweep.json (the index), with automatic rates OUT/capacity.json, OUT/_probe/ and OUT/_capacity/
(each strategy's capacity search: cli.capacity_search), and
OUT/strategy=<label>/rate=<r>/repeat=<k>/ (one run each: collector.layout). A point is done when its point.json
exists, written only after its run returned: summary.json alone proves nothing, since the collector also writes
one for a run that failed or was interrupted. A failed point leaves FAILED.txt and is tried again on resume.
"""
import json
import shutil
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.protocol.settings import ConfigError
from batchlab.cli.fanout import ray_option
from batchlab.cli.launcher import Limits
from batchlab.cli.pool import PoolKeeper, worker_key
from batchlab.cli.sweep_plan import (Plan, Point, SweepError, auto_rates, interleaved, load_plan, parse_sets,
                                     plan_points, span_rates, warm_order)
from batchlab.collector.layout import (CAPACITY_DIR, CAPACITY_FILE, DONE_FILE, FAILED_FILE, INDEX_FILE, OLD_LAYOUT,
                                       PROBE_DIR, RUN_FILE, SUMMARY_FILE, WORKERS_DIR, is_old_layout)
from batchlab.collector.vllm_result import point_result
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.identity import config_hash, differences


def _failure_reason(exc: Exception, folder: Path) -> str:
    """The exception, plus the last error line of the child logs when there is one."""
    hints = []
    for log in sorted([*(folder / "logs").glob("*.log"), *(folder / "logs").glob("*.out")]):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
        hints += [f"{log.name}: {lines[-1].strip()}"] if lines else []
    return "\n".join([f"{type(exc).__name__}: {exc}", *hints])


def execute(point: Point, base: dict, on_tick=None, limits: Limits | None = None,
            pools: PoolKeeper | None = None) -> dict:
    """Run one point into a clean folder; a failure becomes FAILED.txt, never an exception.

    A run stopped at its limit keeps what finished (the rest failed) and is done, with a note; a run
    whose workers never got ready within the start-up limit measured nothing and is failed."""
    from batchlab.cli.launcher import RunTimeout, launch_run

    shutil.rmtree(point.folder, ignore_errors=True)  # leftovers of an interrupted or failed try
    point.folder.mkdir(parents=True)
    started, note = time.monotonic(), ""
    try:
        cfg = point.config(base)
        summary = launch_run(cfg, on_tick=on_tick, limits=limits, pool=pools.for_config(cfg) if pools else None)
    except (ConfigError, RuntimeError, OSError, ValueError) as exc:
        summary_path = point.folder / "summary.json"
        stopped = isinstance(exc, RunTimeout) and exc.phase == "run"
        if not stopped or not summary_path.exists():
            reason = _failure_reason(exc, point.folder)
            (point.folder / FAILED_FILE).write_text(reason + "\n")
            return point.record("failed", reason, round(time.monotonic() - started, 2))
        summary, note = json.loads(summary_path.read_text()), str(exc)  # unfinished requests: failed
    note = note or fault_note(summary)
    point_result(point.folder)  # vllm_result.json: the figures under vllm bench serve's keys
    record = (point.record("done", note, round(time.monotonic() - started, 2)) | _timing(point.folder)
              | {"config_hash": config_hash(cfg.as_settings())})
    headline = {k: summary.get(k) for k in ("finished", "failed", "throughput_tok_s", "window_s")}
    _write_json(point.folder / DONE_FILE, {**record, "summary": headline})
    return record


def preflight(plan: Plan) -> None:
    """Every strategy's settings checked (preset, model) before any process starts: ConfigError."""
    from batchlab.cli.config import checked_config
    from batchlab.cli.preflight import check_before_start

    for entry in plan.entries:
        try:
            check_before_start(checked_config({**plan.base, **entry.overrides, "out": "."}, {}))
        except ConfigError as exc:
            raise SweepError(f"grid.strategies {entry.label}: {exc}") from None


def refuse_old_layout(out_dir: Path) -> None:
    """SweepError when out_dir holds a sweep whose point folders are in the old layout: resuming it would
    measure every point again beside the old ones (`batchlab report` still reads it)."""
    try:
        points = json.loads((out_dir / INDEX_FILE).read_text()).get("points", [])
    except (OSError, ValueError, AttributeError):
        return
    if any(isinstance(p, dict) and is_old_layout(str(p.get("dir", ""))) for p in points):
        raise SweepError(f"{out_dir} holds a sweep in the old folder layout ({OLD_LAYOUT}); batchlab report "
                         "still reads it, but it cannot be resumed: sweep into a new --out")


def reused(point: Point, base: dict, resume: bool, view=None) -> dict | None:
    """A done point's record, marked skipped, when resuming and it measured what is planned now; else
    None (to be measured), with a note naming the keys when its configuration changed."""
    done_file = point.folder / DONE_FILE
    if not (resume and done_file.exists()):
        return None
    changed = stale_point(point, base)
    if not changed:
        return json.loads(done_file.read_text()) | {"status": "skipped"}
    if view is not None:
        view.note(f"{'/'.join(point.folder.parts[-3:])}: measured with another configuration "
                  f"({'; '.join(changed)}); measuring it again")
    return None


def stale_point(point: Point, base: dict) -> list[str]:
    """How a done point's recorded configuration differs from the one planned now (['key old → new',
    ...]; [] when equal): a resumed sweep reuses a point only when it measured what is asked for now.
    The record is the run's own summary.json settings (every version wrote them), else its run.json."""
    try:
        planned = point.config(base).as_settings()
    except ConfigError as exc:  # measured again, so that the point fails with this reason
        return [f"its planned configuration is invalid: {exc}"]
    try:
        recorded = json.loads((point.folder / SUMMARY_FILE).read_text()).get("settings")
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        try:
            recorded = json.loads((point.folder / RUN_FILE).read_text()).get("identity")
        except (OSError, ValueError, AttributeError):
            return ["no readable record of its configuration"]
    return differences(recorded, planned) if isinstance(recorded, dict) else ["no record of its configuration"]


def fault_note(summary: dict) -> str:
    """What `batchlab run` would have said on stderr about a fault ("" when the run lost nothing)."""
    from batchlab.cli.outcome import verdict

    return verdict(summary, summary.get("role_deaths", []))[1]


def _timing(folder: Path) -> dict:
    """Start-up seconds (launch until the traffic's Start: loads, compilation, warm-up) from the launcher."""
    path = folder / "timing.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _write_json(path: Path, data: dict) -> None:
    write_json_atomic(path, data, default=str)


def auto_capacity(plan: Plan, out: Path, pools: PoolKeeper | None, view) -> tuple[dict, list[float]]:
    """Every strategy's capacity searched live (OUT/capacity.json), and the rates placed from it."""
    from batchlab.cli.capacity_search import SearchSettings, run_capacity

    doc = run_capacity(plan, out, SearchSettings.from_auto(plan.auto), pools, view)
    estimates = {lb: c["estimate_req_s"] or c["lo_req_s"] or c["hi_req_s"] for lb, c in doc["strategies"].items()}
    known = [v for v in estimates.values() if v]
    if not known:
        raise SweepError("no strategy's capacity could be bracketed: every probe failed")
    if plan.auto.get("spanned", True):
        return doc, span_rates(known, plan.auto)
    wanted = plan.auto.get("probe") or ("dynamic" if "dynamic" in estimates else plan.entries[0].label)
    if not estimates.get(wanted):
        raise SweepError(f"grid.rates.auto.probe: no capacity measured for a strategy labelled {wanted!r}")
    return doc, auto_rates(estimates[wanted], plan.auto["fractions"])


def _bracket_text(c: dict) -> str:
    lo, hi = c["lo_req_s"], c["hi_req_s"]
    return f"[{'?' if lo is None else f'{lo:.3g}'}, {'?' if hi is None else f'{hi:.3g}'}]"


def run_sweep(config: str, out: str, *, resume: bool = True, sets: dict | None = None) -> dict:
    """Every point of the grid, skipping finished ones; returns the sweep.json index. Points that share
    their workers' settings run on the same warm workers (cli.pool): in the plan's order with every
    group's workers kept warm (interleaved), or group after group (grouped). `sets`: --set overrides."""
    from batchlab.collector.report.live import SweepView

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
            index["points"][i] = (reused(point, plan.base, resume, view)
                                  or execute(point, plan.base, view.ticker(point, "run"), plan.limits(), pools))
            view.finished(point, index["points"][i])
            _write_json(out_dir / INDEX_FILE, index)
        if plan.repeats_auto:
            index = _more_repeats(plan, out_dir, index, pools, view, resume)
    return index


def _more_repeats(plan: Plan, out_dir: Path, index: dict, pools: PoolKeeper, view, resume: bool) -> dict:
    """repeats: auto (cli.sweep_repeats): extra repeats of the headline's comparisons, each point run (or
    skipped on resume) as the grid's are."""
    from batchlab.cli.sweep_repeats import run_more_repeats

    def run_point(point: Point) -> dict:
        record = (reused(point, plan.base, resume, view)
                  or execute(point, plan.base, view.ticker(point, "repeat"), plan.limits(), pools))
        view.finished(point, record)
        return record

    return run_more_repeats(plan, out_dir, index, run_point, lambda doc: _write_json(out_dir / INDEX_FILE, doc))


def register(app: typer.Typer) -> None:
    """Add `batchlab sweep` to the app."""

    @app.command()
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
        out = out or str(Path("results") / Path(config).stem)
        try:
            if ray is not None:
                from batchlab.cli.ray_sweep import RayOptions, run_ray_sweep

                opts = RayOptions(ray, ray_cpus, ray_gpu_resource, ray_shared)
                index = run_ray_sweep(config, out, opts, resume=resume, sets=parse_sets(set_))
            else:
                index = run_sweep(config, out, resume=resume, sets=parse_sets(set_))
        except (SweepError, ConfigError) as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(code=1) from None
        except KeyboardInterrupt as exc:
            from batchlab.cli.outcome import interrupted_exit

            typer.secho(f"interrupted; run the same command again to resume in {out}", err=True)
            raise typer.Exit(code=interrupted_exit(exc)) from None
        statuses = [p["status"] for p in index["points"]]
        ok = len(statuses) - statuses.count("failed")
        typer.echo(f"sweep in {out}: {ok} of {len(statuses)} points done, {statuses.count('failed')} failed "
                   f"(see {Path(out) / INDEX_FILE}); next: batchlab report {out}")
        if ok == 0:
            raise typer.Exit(code=1)
