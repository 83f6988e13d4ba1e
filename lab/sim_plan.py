"""`batchlab simulate`'s plan: the `batchlab sweep` grid (strategies × rates × repeats) to play in virtual time.

The config is either a sweep YAML (`base:` and `grid:`, read by lab.sweep_plan.load_plan, so one file
serves `batchlab sweep` and `batchlab simulate`) or a flat RunConfig YAML; options override `base`, and
`--strategy`/`--rate` may be comma lists that replace the grid's. Several points are written like the
live sweep: OUT/strategy=<label>/rate=<r>/repeat=<k>/ with point.json, and OUT/sweep.json as the index, so
`batchlab report OUT` reads them unchanged. A single point goes to OUT itself. Each entry gets the preset
of the backend it runs on (lab.sim_presets: `--preset hf=A,hf-loop=B,vllm=C`).
"""
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchlab.scheduler.strategies import label
from batchlab.runner.config import checked_config
from batchlab.lab.sim_presets import assign_presets
from batchlab.lab.sweep_plan import Entry, Plan, load_plan
from batchlab.protocol.settings import ConfigError, load_yaml

DEFAULT_OUT = "runs/simulated"


@dataclass(slots=True)
class SimPlan:
    """A grid to simulate, where it goes, and whether points get their own folders."""

    plan: Plan
    out: Path
    layout: bool  # OUT/strategy=<label>/rate=<r>/repeat=<k>/ (else the one point is OUT)
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
    """A flat RunConfig mapping as a one-entry, one-rate grid; checked as a sweep's base is."""
    cfg = checked_config({**values, "out": "."}, {})
    strategy = values.pop("strategy", cfg.strategy)
    values.pop("rate", None)
    return Plan(values, [Entry(str(strategy), {"strategy": strategy})], [cfg.rate], None, 1, cfg.seed)


def plan_simulation(config: str | None, overrides: dict) -> SimPlan:
    """The grid from the YAML (sweep or flat), with the options laid over it."""
    overrides = dict(overrides)
    strategies = _listed(overrides.pop("strategy", None), str)
    rates = _listed(overrides.pop("rate", None), float)
    given = {k: v for k, v in overrides.items() if v is not None}
    raw = load_yaml(config) if config else {}
    swept = "grid" in raw or "base" in raw
    slos = None if swept else raw.pop("slos", None)
    if swept:
        plan = load_plan(config)
    else:  # the options count for its rate and its checks too (strategy_args are checked against --strategy)
        plan = _flat_plan({**raw, **given, **({"strategy": strategies[0]} if strategies else {})})
    plan.base.update(given)
    if strategies:
        plan.entries = [Entry(label(s), {"strategy": s}) for s in strategies]
    if rates:
        plan.rates, plan.auto = sorted(set(rates)), None
    if "seed" in given:
        plan.seed = int(given["seed"])
    default_out = str(Path("results") / Path(config).stem) if swept else DEFAULT_OUT
    out = Path(str(plan.base.pop("out", None) or default_out))
    layout = swept or len(plan.entries) * max(len(plan.rates), 1) * plan.repeats > 1
    assign_presets(plan)  # each entry plays its own backend's step model (lab.sim_presets)
    return SimPlan(plan, out, layout, str(config or ""), slos)
