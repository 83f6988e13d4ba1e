"""`batchlab simulate`'s runs: each point of a SimPlan simulated and written as a live run's folder.

Automatic rates come from a simulated capacity probe (the live sweep's burst, in virtual time).
"""
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from batchlab.cli.sim_plan import SimPlan
from batchlab.cli.sweep_plan import Point, auto_rates, plan_points, probe_point
from batchlab.collector.layout import DONE_FILE, INDEX_FILE, PROBE_DIR
from batchlab.collector.parts import SCHEDULE_FILE, write_final
from batchlab.collector.tables import Tables
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.settings import RunConfig
from batchlab.scheduler.simulator.run import simulate
from batchlab.traffic.run_schedule import make_schedule
from batchlab.traffic.schedule import Schedule, save_schedule


def write_run(out_dir: Path, cfg: RunConfig, schedule: Schedule, tables: Tables,
              saved_schedule: Path | None = None) -> None:
    """The files a live run leaves: config.yaml, schedule.parquet, the tables and summary.json.
    `saved_schedule`: this schedule's file from an earlier point, copied instead of encoded again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.as_settings(), sort_keys=False))
    if saved_schedule is not None and saved_schedule.is_file():
        shutil.copyfile(saved_schedule, out_dir / SCHEDULE_FILE)
    else:
        save_schedule(schedule, out_dir / SCHEDULE_FILE)
    write_final(out_dir, tables)


def simulate_run(cfg: RunConfig, schedule: Schedule | None = None, *, slos: dict | None = None,
                 saved_schedule: Path | None = None) -> dict:
    """Simulate cfg (building its schedule unless given) into cfg.out; return the summary."""
    start_s = time.perf_counter()
    schedule = schedule if schedule is not None else make_schedule(cfg)
    tables = simulate(cfg, schedule, slos=slos)
    tables.summary["simulation_wall_s"] = time.perf_counter() - start_s
    if schedule.notes:
        tables.summary["schedule"] = dict(schedule.notes)
    write_run(Path(cfg.out), cfg, schedule, tables, saved_schedule)
    return tables.summary


def _probe(sim: SimPlan) -> dict:
    """cli.sweep_cmd.probe_capacity in virtual time: a burst on the probe entry; capacity = finished / window."""
    point, duration_s = probe_point(sim.plan, sim.out / PROBE_DIR)
    summary = simulate_run(point.config({**sim.plan.base, "duration_s": duration_s, "max_queue": 0}))
    window_s = summary["window_s"] or float("nan")
    return {"label": point.entry.label, "requests": summary["finished"], "window_s": window_s,
            "capacity_req_s": summary["finished"] / window_s, "saturated": window_s > 1.5 * duration_s}


def _points(sim: SimPlan, probe: dict | None) -> list[Point]:
    rates = sim.plan.rates or auto_rates(probe["capacity_req_s"], sim.plan.auto["fractions"])
    if sim.layout:
        return plan_points(sim.plan, rates, sim.out)
    return [Point(sim.plan.entries[0], rates[0], 0, sim.plan.seed, sim.out)]


def run_simulation(sim: SimPlan, on_point: Callable[[Point, dict], None] | None = None) -> list[tuple[Point, dict]]:
    """Simulate every point (one schedule per rate and seed at a time); (point, summary) in grid order."""
    probe = _probe(sim) if sim.plan.auto and not sim.plan.rates else None
    points = _points(sim, probe)
    configs = [p.config(sim.plan.base) for p in points]
    results: list[dict] = [{} for _ in points]
    key, schedule, saved = None, None, None
    for i in sorted(range(len(points)), key=lambda i: (configs[i].rate, configs[i].seed)):
        if (configs[i].rate, configs[i].seed) != key:
            key, schedule, saved = (configs[i].rate, configs[i].seed), make_schedule(configs[i]), None
        start_s = time.monotonic()
        results[i] = simulate_run(configs[i], schedule, slos=sim.slos, saved_schedule=saved)
        saved = Path(configs[i].out) / SCHEDULE_FILE
        if sim.layout:
            _record_point(points[i], results[i], time.monotonic() - start_s)
        if on_point is not None:
            on_point(points[i], results[i])
    if sim.layout:
        _write_index(sim, points, probe)
    return list(zip(points, results))


def _record_point(point: Point, summary: dict, elapsed_s: float) -> None:
    from batchlab.collector.vllm_result import point_result

    point_result(point.folder)  # vllm_result.json, as a live sweep's point has
    record = point.record("done", "", round(elapsed_s, 3))
    headline = {k: summary.get(k) for k in ("finished", "failed", "throughput_tok_s", "window_s")}
    write_json_atomic(point.folder / DONE_FILE, {**record, "summary": headline, "simulated": True}, default=str)


def _write_index(sim: SimPlan, points: list[Point], probe: dict | None) -> None:
    """OUT/sweep.json as `batchlab sweep` writes it (marked simulated)."""
    plan = sim.plan
    rates = sorted({p.rate for p in points})
    index = {"config": sim.config, "base": plan.base, "rates": rates, "repeats": plan.repeats, "seed": plan.seed,
             "probe": probe, "points": [p.record("done") for p in points],
             "entries": [{"label": e.label, **e.overrides} for e in plan.entries], "simulated": True}
    write_json_atomic(sim.out / INDEX_FILE, index, default=str)
