"""`batchlab simulate`: the `batchlab sweep` grid (strategies × rates × repeats) planned and played in virtual time.

The config is either a sweep YAML (`base:` and `grid:`, read by lab.sweep_plan.load_plan, so one file
serves `batchlab sweep` and `batchlab simulate`) or a flat RunConfig YAML; options override `base`, and
`--strategy`/`--rate` may be comma lists that replace the grid's. Several points are written like the
live sweep: OUT/strategy=<label>/rate=<r>/repeat=<k>/ with point.json, and OUT/sweep.json as the index, so
`batchlab report OUT` reads them unchanged. A single point goes to OUT itself.

Each grid entry plays the step model of the backend kind it runs on (`hf`, `hf-loop`, `vllm`, or the other
backends by name: `--preset hf=A,hf-loop=B,vllm=C`), as docs/simulator.md ("One preset per backend") says;
an entry whose kind has no preset is refused, naming it.

Each point is simulated and written as a live run's folder (`simulate_run`, which tune's predicted runs use
too). Automatic rates come, as in the live sweep, from every strategy's capacity searched in virtual time
(or, with grid.rates.auto.fractions, from fractions of a simulated burst's capacity on one strategy).
"""
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from batchlab.protocol.outcomes import RunOutcome
from batchlab.lab.sweep_plan import AutoRates, Plan, Point, plan_from, study_folder
from batchlab.lab.sweep_order import auto_rates, plan_points, probe_point, span_rates
from batchlab.collector.layout import DONE_FILE, INDEX_FILE, PROBE_DIR
from batchlab.collector.parts import write_final
from batchlab.protocol.modes import BatchingMode
from batchlab.collector.summary import Summary, headline
from batchlab.collector.tables import Tables
from batchlab.protocol.setting_groups import said
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import ConfigError, RunConfig, load_yaml
from batchlab.runner.preflight import checked_config
from batchlab.scheduler.strategies import resolve
from batchlab.simulator.run import simulate
from batchlab.traffic.run_schedule import make_schedule
from batchlab.traffic.schedule import Schedule, save_schedule

DEFAULT_OUT = "runs/simulated"


@dataclass(slots=True)
class SimPlan:
    """A grid to simulate, where it goes, and whether points get their own folders."""

    plan: Plan
    out: Path
    layout: bool  # OUT/strategy=<label>/rate=<r>/repeat=<k>/ (else the one point is OUT)
    config: str = ""
    slos: dict | None = None


def plan_simulation(given: object, changes: dict) -> SimPlan:
    """The grid to simulate: `given` (a plan, its mapping or YAML, or a run's settings: lab.sweep_plan.plan_from;
    None: a run of the default settings) with `changes` laid over it (None: not given); `out` is where it
    goes (default results/<the YAML's name> for a sweep's YAML, else runs/simulated)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    out, slos = changes.pop("out", None), None
    source = str(given) if isinstance(given, (str, Path)) else ""
    if source:
        given = load_yaml(source)
    swept = isinstance(given, Plan) or (isinstance(given, dict) and bool(given) and set(given) <= {"base", "grid"})
    if isinstance(given, dict) and not swept:
        slos = given.pop("slos", None)  # a run's YAML may give the report's SLOs beside its settings
    plan, _ = plan_from({} if given is None else given, changes)
    default_out = str(study_folder(source)) if swept and source else DEFAULT_OUT
    out = Path(str(out or plan.base.pop("out", None) or default_out))
    plan.base.pop("out", None)
    layout = swept or len(plan.entries) * max(len(plan.rates), len(plan.concurrency), 1) * plan.repeats > 1
    assign_presets(plan)  # each entry plays its own backend's step model (below)
    return SimPlan(plan, out, layout, source, slos)


KINDS = ("hf", "hf-loop", "vllm", "sim", "echo", "openai")
NEEDS_NO_PRESET = ("sim", "echo")  # the sim backend's own preset (RunConfig's default); echo: zero time
CALIBRATED_KIND = {("hf", BatchingMode.STATIC): "hf", ("hf", BatchingMode.CONTINUOUS): "hf-loop",
                   ("vllm", BatchingMode.CONTINUOUS): "vllm"}


def entry_kind(values: dict) -> str:
    """The backend kind a run with these settings plays on (hf splits by the strategy's mode)."""
    cfg = checked_config({**values, "out": "."}, {})
    if cfg.backend == "hf":
        return "hf-loop" if resolve(cfg).mode == BatchingMode.CONTINUOUS else "hf"
    return cfg.backend


def parse_presets(value: object) -> tuple[str | None, dict[str, str]]:
    """'NAME' → (NAME, {}); 'hf=A,vllm=B' → (None, {hf: A, vllm: B}); ConfigError on an unknown kind."""
    if value is None or value == "":
        return None, {}
    if isinstance(value, dict):
        pairs = {str(k): str(v) for k, v in value.items()}
    elif "=" not in str(value):
        return str(value), {}
    else:
        pairs = {}
        for item in (s.strip() for s in str(value).split(",") if s.strip()):
            kind, sep, preset = item.partition("=")
            if not sep or not preset.strip():
                raise ConfigError(f"{said('preset')} {value!r}: {item!r} is not KIND=PRESET")
            pairs[kind.strip()] = preset.strip()
    unknown = sorted(set(pairs) - set(KINDS))
    if unknown:
        raise ConfigError(f"{said('preset')}: unknown backend kind(s) {', '.join(unknown)} (one of {', '.join(KINDS)})")
    return None, pairs


def assign_presets(plan: Plan) -> dict[str, str]:
    """Give every entry the preset of its kind (in its overrides); {label: kind}. ConfigError naming the
    missing kind, or a single preset given to a grid of several kinds."""
    single, by_kind = parse_presets(plan.base.pop("preset", None))
    kinds = {e.label: entry_kind({**plan.base, **{k: v for k, v in e.overrides.items() if k != "preset"}})
             for e in plan.entries}
    unset = {kinds[e.label] for e in plan.entries if "preset" not in e.overrides}
    if single is not None and len(unset) > 1:
        raise ConfigError(f"{said('preset')} {single}: one preset for a grid on {len(unset)} backends "
                          f"({', '.join(sorted(unset))}); give one per backend, e.g. "
                          f"{said('preset', ','.join(f'{k}=PRESET' for k in sorted(unset)))}")
    for e in plan.entries:
        kind = kinds[e.label]
        preset = e.overrides.get("preset") or by_kind.get(kind) or single
        if preset is None and kind not in NEEDS_NO_PRESET:
            given = f" (given: {', '.join(sorted(by_kind))})" if by_kind else ""
            raise ConfigError(f"no step-model preset for {kind}, which strategy {e.label} runs on{given}: "
                              f"add {kind}=PRESET to {said('preset')} (a preset `batchlab calibrate` wrote for it)")
        if preset is not None:
            _check_calibrated_for(preset, kind, e.label)
            e.overrides = {**e.overrides, "preset": preset}
    return kinds


def _check_calibrated_for(preset: str, kind: str, label: str) -> None:
    """A preset file (given, or shipped under a name) that records what it was calibrated on must match the
    entry's kind."""
    from batchlab.worker.gpu_presets import preset_kind
    from batchlab.worker.stepmodel import PRESET_DIR, get_preset

    try:
        get_preset(preset)  # naming the choices when it is neither a name nor a file
    except ValueError as exc:
        raise ConfigError(f"{said('preset')}: {exc}") from None
    path = Path(preset) if Path(preset).is_file() else PRESET_DIR / f"{preset}.yaml"
    if path.is_file():
        record = (yaml.safe_load(path.read_text()) or {}).get("calibration") or {}
        made_for = CALIBRATED_KIND.get((record.get("backend"), record.get("mode")))
    else:  # a GPU preset says its kind in its name (GPU-MODEL-KIND)
        made_for = preset_kind(preset)
    if made_for and kind in CALIBRATED_KIND.values() and made_for != kind:
        raise ConfigError(f"preset {preset} was calibrated on {made_for}, but strategy {label} runs on {kind}")


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


def simulated_capacity(plan: Plan, settings: AutoRates, labels: list[str] | None = None) -> dict:
    """Every strategy's (or each labelled one's) capacity searched in virtual time (lab.capacity_search), as
    capacity.json holds it."""
    from batchlab.lab.capacity_search import SimulatedSearch, capacity_document, search_all

    return capacity_document(search_all(plan, SimulatedSearch(plan, settings), settings, labels), settings)


def _auto_rates(sim: SimPlan, probe: dict | None, capacity: dict | None) -> list[float]:
    if capacity is None:
        return auto_rates(probe["capacity_req_s"], sim.plan.auto.fractions)
    known = [c["estimate_req_s"] or c["lo_req_s"] or c["hi_req_s"] for c in capacity["strategies"].values()]
    return span_rates([v for v in known if v], sim.plan.auto)


def _points(sim: SimPlan, probe: dict | None, capacity: dict | None = None) -> list[Point]:
    rates = sim.plan.rates or ([] if sim.plan.concurrency else _auto_rates(sim, probe, capacity))
    if sim.layout:
        return plan_points(sim.plan, rates, sim.out)
    if sim.plan.concurrency:  # one closed-loop point
        return [Point(sim.plan.entries[0], math.inf, 0, sim.plan.seed, sim.out, sim.plan.concurrency[0])]
    return [Point(sim.plan.entries[0], rates[0], 0, sim.plan.seed, sim.out)]


def run_simulation(sim: SimPlan, on_point: Callable[[Point, dict, float], None] | None = None,
                   fanout=None) -> list[tuple[Point, dict]]:
    """Simulate every point (the points of one schedule, rate and seed, together: one evaluation each,
    fanned out by `fanout`, a lab.fanout.Fanout); (point, summary) in grid order. `on_point(point, summary,
    elapsed_s)` gets each point's own time (points come back a group at a time)."""
    from batchlab.lab.fanout import Fanout

    auto = bool(sim.plan.auto) and not sim.plan.rates
    capacity = simulated_capacity(sim.plan, sim.plan.auto) if auto and sim.plan.auto.spanned else None
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
                on_point(points[i], results[i], elapsed_s)
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
    record = point.record(RunOutcome.DONE, "", round(elapsed_s, 3))
    write_json_atomic(point.folder / DONE_FILE, {**record, "summary": headline(summary), "simulated": True},
                      default=str)


def _write_index(sim: SimPlan, points: list[Point], probe: dict | None, capacity: dict | None = None) -> None:
    """OUT/sweep.json as `batchlab sweep` writes it (marked simulated)."""
    plan = sim.plan
    rates = [] if plan.concurrency else sorted({p.rate for p in points})
    index = {"config": sim.config, "base": plan.base, "rates": rates, "repeats": plan.repeats, "seed": plan.seed,
             **({"concurrency": plan.concurrency} if plan.concurrency else {}),
             "probe": probe, "capacity": capacity, "points": [p.record(RunOutcome.DONE) for p in points],
             "entries": [{"label": e.label, **e.overrides} for e in plan.entries], "simulated": True}
    write_json_atomic(sim.out / INDEX_FILE, index, default=str)
