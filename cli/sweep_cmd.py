"""`batchlab sweep CONFIG`: strategies × backends × rates × repeats, one real run per point, resumable.

Layout: OUT/sweep.json (the index), OUT/_probe/ (the capacity probe for automatic rates) and
OUT/<label>/rate-<r>/rep-<k>/ (one run each). A point is done when its point.json exists, written only
after its run returned: summary.json alone proves nothing, since the collector also writes one for a
run that failed or was interrupted. A failed point leaves FAILED.txt and is tried again on resume.
"""
import json
import shutil
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.protocol.settings import ConfigError
from batchlab.cli.launcher import Limits
from batchlab.cli.pool import PoolKeeper, worker_key
from batchlab.cli.sweep_plan import (Plan, Point, SweepError, auto_rates, interleaved, load_plan, parse_sets,
                                     plan_points, probe_point, warm_order)
from batchlab.collector.layout import DONE_FILE, FAILED_FILE, INDEX_FILE, PROBE_DIR, RUN_FILE, SUMMARY_FILE, WORKERS_DIR
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


def probe_capacity(plan: Plan, out: Path, on_tick=None, pools: PoolKeeper | None = None) -> dict:
    """A short saturating run (a burst of requests) on the probe entry: capacity = finished / window."""
    folder = out / PROBE_DIR
    if (folder / DONE_FILE).exists():  # resume keeps the rates the sweep started with
        return json.loads((folder / DONE_FILE).read_text())["probe"]
    point, duration_s = probe_point(plan, folder)
    wanted = point.entry.label
    base = {**plan.base, "duration_s": duration_s, "max_queue": 0}
    record = execute(point, base, on_tick, plan.limits(), pools)
    if record["status"] != "done":
        raise SweepError(f"the capacity probe ({wanted}) failed: {record['reason'].splitlines()[0]}")
    summary = json.loads((folder / "summary.json").read_text())
    window_s = summary["window_s"] or float("nan")
    probe = {"label": wanted, "requests": summary["finished"], "window_s": window_s,
             "capacity_req_s": summary["finished"] / window_s,
             "saturated": window_s > 1.5 * duration_s}  # else the worker kept up: capacity is a floor
    _write_json(folder / DONE_FILE, {**record, "probe": probe})
    return probe


def run_sweep(config: str, out: str, *, resume: bool = True, sets: dict | None = None) -> dict:
    """Every point of the grid, skipping finished ones; returns the sweep.json index. Points that share
    their workers' settings run on the same warm workers (cli.pool): in the plan's order with every
    group's workers kept warm (interleaved), or group after group (grouped). `sets`: --set overrides."""
    from batchlab.collector.report.live import SweepView

    plan, out_dir = load_plan(config, sets), Path(out)
    preflight(plan)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        shutil.rmtree(out_dir / PROBE_DIR, ignore_errors=True)
    mixed = interleaved(plan)
    with SweepView() as view, PoolKeeper(out_dir / WORKERS_DIR, keep_all=mixed) as pools:
        probe = (probe_capacity(plan, out_dir, view.ticker(None, "probe"), pools) if plan.auto else None)
        rates = plan.rates or auto_rates(probe["capacity_req_s"], plan.auto["fractions"])
        if probe:
            view.note(f"capacity of {probe['label']}: {probe['capacity_req_s']:.3g} req/s → rates {rates}")
        points = plan_points(plan, rates, out_dir)
        if not mixed:
            points = warm_order(points, plan.base, worker_key, first=probe["label"] if probe else None)
        index = {"config": str(config), "base": plan.base, "rates": rates, "repeats": plan.repeats,
                 "order": "interleaved" if mixed else "grouped",
                 "seed": plan.seed, "probe": probe, "points": [p.record("pending") for p in points],
                 "entries": [{"label": e.label, **e.overrides} for e in plan.entries]}
        view.start(len(points))
        for i, point in enumerate(points):
            done_file = point.folder / DONE_FILE
            changed = stale_point(point, plan.base) if resume and done_file.exists() else None
            if resume and done_file.exists() and not changed:
                index["points"][i] = json.loads(done_file.read_text()) | {"status": "skipped"}
            else:
                if changed:
                    view.note(f"{'/'.join(point.folder.parts[-3:])}: measured with another configuration "
                              f"({'; '.join(changed)}); measuring it again")
                index["points"][i] = execute(point, plan.base, view.ticker(point, "run"), plan.limits(), pools)
            view.finished(point, index["points"][i])
            _write_json(out_dir / INDEX_FILE, index)
    return index


def register(app: typer.Typer) -> None:
    """Add `batchlab sweep` to the app."""

    @app.command()
    def sweep(config: Annotated[str, typer.Argument(help="sweep YAML (base: and grid:)")], *,
              out: Annotated[Optional[str], typer.Option(help="output folder")] = None,
              resume: Annotated[bool, typer.Option(help="skip points already done")] = True,
              set_: Annotated[Optional[list[str]], typer.Option(
                  "--set", help="override a base setting, KEY=VALUE (a RunConfig name, e.g. duration_s=5), or a "
                                "grid key, grid.KEY=VALUE (e.g. grid.repeats=2); repeatable")] = None) -> None:
        """Run a grid of strategies × backends × rates × repeats, one real run per point."""
        out = out or str(Path("results") / Path(config).stem)
        try:
            index = run_sweep(config, out, resume=resume, sets=parse_sets(set_))
        except (SweepError, ConfigError) as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(code=1) from None
        except KeyboardInterrupt:
            typer.secho(f"interrupted; run the same command again to resume in {out}", err=True)
            raise typer.Exit(code=130) from None
        statuses = [p["status"] for p in index["points"]]
        ok = len(statuses) - statuses.count("failed")
        typer.echo(f"sweep in {out}: {ok} of {len(statuses)} points done, {statuses.count('failed')} failed "
                   f"(see {Path(out) / INDEX_FILE}); next: batchlab report {out}")
        if ok == 0:
            raise typer.Exit(code=1)
