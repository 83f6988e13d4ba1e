"""Simulated sweeps: the `batchlab sweep` grid (strategies × rates × repeats) in virtual time.

The config is either a sweep YAML (`base:` and `grid:`, read by cli.sweep_plan.load_plan, so one file
serves `batchlab sweep` and `batchlab simulate`) or a flat RunConfig YAML; options override `base`, and
`--strategy`/`--rate` may be comma lists that replace the grid's. Several points are written like the
live sweep: OUT/<label>/rate-<r>/rep-<k>/ with point.json, and OUT/sweep.json as the index, so
`batchlab report OUT` reads them unchanged. A single point goes to OUT itself. Automatic rates come
from a simulated capacity probe (the live sweep's burst, in virtual time).
"""
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchlab.protocol.settings import ConfigError, RunConfig, load_yaml
from batchlab.cli.sweep_plan import (PROBE_DURATION_S, PROBE_REQUESTS, Entry, Plan, Point, auto_rates, load_plan,
                            plan_points)
from batchlab.collector.layout import DONE_FILE, INDEX_FILE, PROBE_DIR
from batchlab.scheduler.simulator.run import simulate_run
from batchlab.traffic.run_schedule import make_schedule

DEFAULT_OUT = "runs/simulated"


@dataclass(slots=True)
class SimPlan:
    """A grid to simulate, where it goes, and whether points get their own folders."""

    plan: Plan
    out: Path
    layout: bool  # OUT/<label>/rate-<r>/rep-<k>/ (else the one point is OUT)
    config: str = ""
    slos: dict | None = None


def _listed(value: object, cast: Callable) -> list | None:
    """A comma list ("5,10") or None."""
    if value is None:
        return None
    try:
        return [cast(v.strip()) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"cannot read {value!r} as a comma list") from None


def _flat_plan(values: dict) -> Plan:
    """A flat RunConfig mapping as a one-entry, one-rate grid."""
    defaults = RunConfig()
    strategy, rate = values.pop("strategy", defaults.strategy), values.pop("rate", defaults.rate)
    entry = Entry(str(strategy), {"strategy": strategy})
    return Plan(values, [entry], [float(rate)], {}, 1, int(values.get("seed", defaults.seed)))


def plan_simulation(config: str | None, overrides: dict) -> SimPlan:
    """The grid from the YAML (sweep or flat), with the options laid over it."""
    overrides = dict(overrides)
    strategies = _listed(overrides.pop("strategy", None), str)
    rates = _listed(overrides.pop("rate", None), float)
    given = {k: v for k, v in overrides.items() if v is not None}
    raw = load_yaml(config) if config else {}
    swept = "grid" in raw or "base" in raw
    plan = load_plan(config) if swept else _flat_plan(raw)
    slos = plan.base.pop("slos", None)
    plan.base.update(given)
    if strategies:
        plan.entries = [Entry(s, {"strategy": s}) for s in strategies]
    if rates:
        plan.rates, plan.auto = sorted(set(rates)), {}
    if "seed" in given:
        plan.seed = int(given["seed"])
    default_out = str(Path("results") / Path(config).stem) if swept else DEFAULT_OUT
    out = Path(str(plan.base.pop("out", None) or default_out))
    layout = swept or len(plan.entries) * max(len(plan.rates), 1) * plan.repeats > 1
    return SimPlan(plan, out, layout, str(config or ""), slos)


def _probe(sim: SimPlan) -> dict:
    """cli.sweep_cmd.probe_capacity in virtual time: a burst on the probe entry; capacity = finished / window."""
    auto, entries = sim.plan.auto, sim.plan.entries
    wanted = auto.get("probe") or next((e.label for e in entries if e.label == "dynamic"), entries[0].label)
    entry = next((e for e in entries if e.label == wanted), None)
    if entry is None:
        raise ConfigError(f"grid.rates.auto.probe: no strategy labelled {wanted!r}")
    duration_s = float(auto.get("probe_duration_s", PROBE_DURATION_S))
    n = int(auto.get("probe_requests", PROBE_REQUESTS))
    point = Point(entry, n / duration_s, 0, sim.plan.seed, sim.out / PROBE_DIR)
    summary = simulate_run(point.config({**sim.plan.base, "duration_s": duration_s, "max_queue": 0}))
    window_s = summary["window_s"] or float("nan")
    return {"label": wanted, "requests": summary["finished"], "window_s": window_s,
            "capacity_req_s": summary["finished"] / window_s, "saturated": window_s > 1.5 * duration_s}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


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
        saved = Path(configs[i].out) / "schedule.parquet"
        if sim.layout:
            _record_point(points[i], results[i], time.monotonic() - start_s)
        if on_point is not None:
            on_point(points[i], results[i])
    if sim.layout:
        _write_index(sim, points, probe)
    return list(zip(points, results))


def _record_point(point: Point, summary: dict, elapsed_s: float) -> None:
    record = point.record("done", "", round(elapsed_s, 3))
    headline = {k: summary.get(k) for k in ("finished", "failed", "throughput_tok_s", "window_s")}
    _write_json(point.folder / DONE_FILE, {**record, "summary": headline, "simulated": True})


def _write_index(sim: SimPlan, points: list[Point], probe: dict | None) -> None:
    """OUT/sweep.json as `batchlab sweep` writes it (marked simulated)."""
    plan = sim.plan
    rates = sorted({p.rate for p in points})
    index = {"config": sim.config, "base": plan.base, "rates": rates, "repeats": plan.repeats, "seed": plan.seed,
             "probe": probe, "points": [p.record("done") for p in points],
             "entries": [{"label": e.label, **e.overrides} for e in plan.entries], "simulated": True}
    _write_json(sim.out / INDEX_FILE, index)
