"""Simulated sweeps: strategies × rates (× repeats), one output folder per point.

A sweep YAML holds RunConfig fields plus `strategies: [...]`, `rates: [...]`, optionally `repeats: N`
(rep k uses seed + k) and `slos: {ttft: 1.0, ...}` (goodput); `strategy:` and `rate:` may also be
lists, and on the command line comma lists (`--rate 5,10,20`). Several points are written as
OUT/<strategy>/rate-<r>/rep-<k>/ (the live sweep's layout); a single point goes to OUT itself.
"""
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cli.config import ConfigError, RunConfig, build_config
from collector.parts import SCHEDULE_FILE
from simulator.run import simulate_run

SWEEP_KEYS = ("strategies", "rates", "repeats", "slos")
DEFAULT_OUT = "runs/simulated"


@dataclass(slots=True)
class Point:
    """One run of a sweep."""

    strategy: str
    rate: float
    rep: int
    cfg: RunConfig


@dataclass(slots=True)
class SweepPlan:
    """The points to simulate and where they go."""

    points: list[Point]
    slos: dict | None = None


def point_dir(out: str | Path, strategy: str, rate: float, rep: int) -> Path:
    """OUT/<strategy>/rate-<r>/rep-<k>/ (rates as %g: 5, 12.5)."""
    return Path(out) / strategy / f"rate-{rate:g}" / f"rep-{rep}"


def _listed(value: object, cast: Callable) -> list | None:
    """A YAML list, a comma list ("5,10"), a scalar, or None."""
    if value is None:
        return None
    items = value if isinstance(value, list) else str(value).split(",")
    try:
        return [cast(str(v).strip()) for v in items if str(v).strip()]
    except ValueError:
        raise ConfigError(f"cannot read {value!r} as a list") from None


def _axis(values: dict, overrides: dict, name: str, plural_name: str, cast: Callable, default: object) -> list:
    """One axis (strategy or rate): the option's list, else the file's plural key, else its singular."""
    given = _listed(overrides.pop(name, None), cast)
    plural = _listed(values.pop(plural_name, None), cast)
    single = _listed(values.pop(name, None), cast)
    return given or plural or single or [default]


def plan_sweep(file_values: dict, overrides: dict) -> SweepPlan:
    """Defaults ← file ← options, expanded to one validated RunConfig per point."""
    values, overrides = dict(file_values), dict(overrides)
    swept = any(k in values for k in SWEEP_KEYS) or any(isinstance(values.get(k), list)
                                                        for k in ("strategy", "rate"))
    strategies = _axis(values, overrides, "strategy", "strategies", str, RunConfig().strategy)
    rates = _axis(values, overrides, "rate", "rates", float, RunConfig().rate)
    repeats, slos = int(values.pop("repeats", 1)), values.pop("slos", None)
    if repeats < 1:
        raise ConfigError("repeats must be ≥ 1")
    values.setdefault("out", DEFAULT_OUT)
    base = build_config(values, {**overrides, "strategy": strategies[0], "rate": rates[0]})
    layout = swept or len(strategies) * len(rates) * repeats > 1
    points = []
    for strategy in strategies:
        for rate in rates:
            for rep in range(repeats):
                out = point_dir(base.out, strategy, rate, rep) if layout else Path(base.out)
                cfg = dataclasses.replace(base, strategy=strategy, rate=rate, seed=base.seed + rep,
                                          out=str(out), extra=dict(base.extra))
                points.append(Point(strategy, rate, rep, cfg.validate()))
    return SweepPlan(points, slos)


def run_sweep(plan: SweepPlan, on_point: Callable[[Point, dict], None] | None = None) -> list[dict]:
    """Simulate every point, one schedule per (rate, seed) held at a time; summaries in plan order."""
    from cli.roles import make_schedule

    summaries: list[dict] = [{} for _ in plan.points]
    schedule, schedule_key, saved = None, None, None
    for i in sorted(range(len(plan.points)), key=lambda i: _schedule_key(plan.points[i])):
        point = plan.points[i]
        if _schedule_key(point) != schedule_key:
            schedule, schedule_key, saved = make_schedule(point.cfg), _schedule_key(point), None
        summaries[i] = simulate_run(point.cfg, schedule, slos=plan.slos, saved_schedule=saved)
        saved = Path(point.cfg.out) / SCHEDULE_FILE
        if on_point is not None:
            on_point(point, summaries[i])
    return summaries


def _schedule_key(point: Point) -> tuple[float, int]:
    return point.cfg.rate, point.cfg.seed
