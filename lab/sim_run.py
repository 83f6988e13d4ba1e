"""`batchlab simulate`'s runs: each point of a SimPlan simulated and written as a live run's folder.

Automatic rates come, as in the live sweep, from every strategy's capacity searched in virtual time
(or, with grid.rates.auto.fractions, from fractions of a simulated burst's capacity on one strategy).
"""
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from batchlab.lab.sim_plan import SimPlan
from batchlab.lab.sweep_plan import AutoRates, Point, auto_rates, plan_points, probe_point, span_rates
from batchlab.collector.layout import DONE_FILE, INDEX_FILE, PROBE_DIR
from batchlab.collector.parts import write_final
from batchlab.collector.summary import Summary, headline
from batchlab.collector.tables import Tables
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig
from batchlab.simulator.run import simulate
from batchlab.traffic.run_schedule import make_schedule
from batchlab.traffic.schedule import Schedule, save_schedule


def write_run(out_dir: Path, cfg: RunConfig, schedule: Schedule, tables: Tables,
              saved_schedule: Path | None = None) -> None:
    """The files a live run leaves: config.yaml, schedule.parquet, the tables and summary.json.
    `saved_schedule`: this schedule's file from an earlier point, copied instead of encoded again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = RunDir(out_dir)
    folder.config.write_text(yaml.safe_dump(cfg.as_settings(), sort_keys=False))
    if saved_schedule is not None and saved_schedule.is_file():
        shutil.copyfile(saved_schedule, folder.schedule)
    else:
        save_schedule(schedule, folder.schedule)
    write_final(out_dir, tables)


def simulate_run(cfg: RunConfig, schedule: Schedule | None = None, *, slos: dict | None = None,
                 saved_schedule: Path | None = None) -> Summary:
    """Simulate cfg (building its schedule unless given) into cfg.out; return the summary."""
    start_s = time.perf_counter()
    schedule = schedule if schedule is not None else make_schedule(cfg)
    tables = simulate(cfg, schedule, slos=slos)
    tables.summary.simulation_wall_s = time.perf_counter() - start_s
    if schedule.notes:
        tables.summary.schedule = dict(schedule.notes)
    write_run(Path(cfg.out), cfg, schedule, tables, saved_schedule)
    return tables.summary


def _probe(sim: SimPlan) -> dict:
    """cli.sweep_cmd.probe_capacity in virtual time: a burst on the probe entry; capacity = finished / window."""
    point, duration_s = probe_point(sim.plan, sim.out / PROBE_DIR)
    summary = simulate_run(point.config({**sim.plan.base, "duration_s": duration_s, "max_queue": 0}))
    return {"label": point.entry.label, "requests": summary.finished, "window_s": summary.window_s,
            "capacity_req_s": summary.requests_per_s, "saturated": summary.window_s > 1.5 * duration_s}


def _capacity(sim: SimPlan) -> dict:
    """Every strategy's capacity searched in virtual time (lab.capacity_search), as capacity.json holds it."""
    from batchlab.lab.capacity_search import SimulatedSearch, capacity_document, search_all

    settings = sim.plan.auto or AutoRates()
    return capacity_document(search_all(sim.plan, SimulatedSearch(sim.plan, settings), settings), settings)


def _auto_rates(sim: SimPlan, probe: dict | None, capacity: dict | None) -> list[float]:
    if capacity is None:
        return auto_rates(probe["capacity_req_s"], sim.plan.auto.fractions)
    known = [c["estimate_req_s"] or c["lo_req_s"] or c["hi_req_s"] for c in capacity["strategies"].values()]
    return span_rates([v for v in known if v], sim.plan.auto)


def _points(sim: SimPlan, probe: dict | None, capacity: dict | None = None) -> list[Point]:
    rates = sim.plan.rates or ([] if sim.plan.concurrency else _auto_rates(sim, probe, capacity))
    if sim.layout:
        return plan_points(sim.plan, rates, sim.out)
    return [Point(sim.plan.entries[0], rates[0], 0, sim.plan.seed, sim.out)]


def run_simulation(sim: SimPlan, on_point: Callable[[Point, dict], None] | None = None,
                   fanout=None) -> list[tuple[Point, dict]]:
    """Simulate every point (the points of one schedule, rate and seed, together: one evaluation each,
    fanned out by `fanout`, a lab.fanout.Fanout); (point, summary) in grid order."""
    from batchlab.lab.fanout import Fanout

    auto = bool(sim.plan.auto) and not sim.plan.rates
    capacity = _capacity(sim) if auto and sim.plan.auto.spanned else None
    probe = _probe(sim) if auto and capacity is None else None
    points = _points(sim, probe, capacity)
    configs = [p.config(sim.plan.base) for p in points]
    results: list[dict] = [{} for _ in points]
    groups: dict[tuple, list[int]] = {}
    for i in sorted(range(len(points)), key=lambda i: (configs[i].rate, configs[i].seed)):
        groups.setdefault((configs[i].rate, configs[i].seed), []).append(i)
    fanout = fanout or Fanout()
    shared = (sim.slos, fanout.ray_address is not None)  # on Ray, folders come back as tarballs
    outcomes = fanout.map(simulate_group, [[configs[i] for i in g] for g in groups.values()], shared)
    for indices, outcome in zip(groups.values(), outcomes):
        for i, (summary, elapsed_s, tar) in zip(indices, outcome):
            if tar is not None:
                from batchlab.lab.ray_actor import unpack

                unpack(tar, Path(configs[i].out))
            results[i] = summary
            if sim.layout:
                _record_point(points[i], results[i], elapsed_s)
            if on_point is not None:
                on_point(points[i], results[i])
    if sim.layout:
        _write_index(sim, points, probe, capacity)
    return list(zip(points, results))


def simulate_group(shared: tuple[dict | None, bool], configs: list[RunConfig]) -> list[tuple[dict, float, bytes | None]]:
    """The points of one schedule simulated in turn (it is built once): (summary, seconds, the folder's
    tarball when `shared` says to ship it, else None) each."""
    slos, ship = shared
    schedule, saved, done = make_schedule(configs[0]), None, []
    for cfg in configs:
        start_s = time.monotonic()
        summary = simulate_run(cfg, schedule, slos=slos, saved_schedule=saved)
        saved = RunDir(cfg.out).schedule
        done.append((summary, time.monotonic() - start_s, None))
    if ship:  # packed after the group: its later points copied the first one's schedule file
        from batchlab.lab.ray_actor import pack

        done = [(summary, elapsed_s, pack(Path(cfg.out))) for cfg, (summary, elapsed_s, _) in zip(configs, done)]
    return done


def _record_point(point: Point, summary: Summary, elapsed_s: float) -> None:
    from batchlab.collector.vllm_result import point_result

    point_result(point.folder)  # vllm_result.json, as a live sweep's point has
    record = point.record("done", "", round(elapsed_s, 3))
    write_json_atomic(point.folder / DONE_FILE, {**record, "summary": headline(summary), "simulated": True},
                      default=str)


def _write_index(sim: SimPlan, points: list[Point], probe: dict | None, capacity: dict | None = None) -> None:
    """OUT/sweep.json as `batchlab sweep` writes it (marked simulated)."""
    plan = sim.plan
    rates = [] if plan.concurrency else sorted({p.rate for p in points})
    index = {"config": sim.config, "base": plan.base, "rates": rates, "repeats": plan.repeats, "seed": plan.seed,
             **({"concurrency": plan.concurrency} if plan.concurrency else {}),
             "probe": probe, "capacity": capacity, "points": [p.record("done") for p in points],
             "entries": [{"label": e.label, **e.overrides} for e in plan.entries], "simulated": True}
    write_json_atomic(sim.out / INDEX_FILE, index, default=str)
