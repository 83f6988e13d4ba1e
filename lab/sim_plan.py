"""`batchlab simulate`'s plan: the `batchlab sweep` grid (strategies × rates × repeats) to play in virtual time.

The config is either a sweep YAML (`base:` and `grid:`, read by lab.sweep_plan.load_plan, so one file
serves `batchlab sweep` and `batchlab simulate`) or a flat RunConfig YAML; options override `base`, and
`--strategy`/`--rate` may be comma lists that replace the grid's. Several points are written like the
live sweep: OUT/strategy=<label>/rate=<r>/repeat=<k>/ with point.json, and OUT/sweep.json as the index, so
`batchlab report OUT` reads them unchanged. A single point goes to OUT itself. Each entry gets the preset
of the backend it runs on (`--preset hf=A,hf-loop=B,vllm=C`).

Which step model each grid entry plays: the preset of the backend kind it runs on (`hf`, `hf-loop`,
`vllm`, or the other backends by name), as docs/simulator.md ("One preset per backend") says; an entry
whose kind has no preset is refused, naming it.
"""
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchlab.lab.sweep_plan import Entry, Plan, load_plan
from batchlab.protocol.settings import ConfigError, load_yaml
from batchlab.runner.config import checked_config
from batchlab.scheduler.strategies import label, resolve

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
    assign_presets(plan)  # each entry plays its own backend's step model (lab.sim_plan)
    return SimPlan(plan, out, layout, str(config or ""), slos)


KINDS = ("hf", "hf-loop", "vllm", "sim", "echo", "openai")
NEEDS_NO_PRESET = ("sim", "echo")  # the sim backend's own preset (RunConfig's default); echo: zero time
CALIBRATED_KIND = {("hf", "static"): "hf", ("hf", "continuous"): "hf-loop", ("vllm", "continuous"): "vllm"}


def entry_kind(values: dict) -> str:
    """The backend kind a run with these settings plays on (hf splits by the strategy's mode)."""
    cfg = checked_config({**values, "out": "."}, {})
    if cfg.backend == "hf":
        return "hf-loop" if resolve(cfg).mode == "continuous" else "hf"
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
                raise ConfigError(f"--preset {value!r}: {item!r} is not KIND=PRESET")
            pairs[kind.strip()] = preset.strip()
    unknown = sorted(set(pairs) - set(KINDS))
    if unknown:
        raise ConfigError(f"--preset: unknown backend kind(s) {', '.join(unknown)} (one of {', '.join(KINDS)})")
    return None, pairs


def assign_presets(plan: Plan) -> dict[str, str]:
    """Give every entry the preset of its kind (in its overrides); {label: kind}. ConfigError naming the
    missing kind, or a single preset given to a grid of several kinds."""
    single, by_kind = parse_presets(plan.base.pop("preset", None))
    kinds = {e.label: entry_kind({**plan.base, **{k: v for k, v in e.overrides.items() if k != "preset"}})
             for e in plan.entries}
    unset = {kinds[e.label] for e in plan.entries if "preset" not in e.overrides}
    if single is not None and len(unset) > 1:
        raise ConfigError(f"--preset {single}: one preset for a grid on {len(unset)} backends "
                          f"({', '.join(sorted(unset))}); give one per backend, e.g. "
                          f"--preset {','.join(f'{k}=PRESET' for k in sorted(unset))}")
    for e in plan.entries:
        kind = kinds[e.label]
        preset = e.overrides.get("preset") or by_kind.get(kind) or single
        if preset is None and kind not in NEEDS_NO_PRESET:
            given = f" (given: {', '.join(sorted(by_kind))})" if by_kind else ""
            raise ConfigError(f"no step-model preset for {kind}, which strategy {e.label} runs on{given}: "
                              f"add {kind}=PRESET to --preset (a preset `batchlab calibrate` wrote for it)")
        if preset is not None:
            _check_calibrated_for(preset, kind, e.label)
            e.overrides = {**e.overrides, "preset": preset}
    return kinds


def _check_calibrated_for(preset: str, kind: str, label: str) -> None:
    """A preset file (given, or shipped under a name) that records what it was calibrated on must match the
    entry's kind."""
    from batchlab.worker.stepmodel import PRESET_DIR, get_preset

    get_preset(preset)  # ValueError naming the choices when it is neither a name nor a file
    path = Path(preset) if Path(preset).is_file() else PRESET_DIR / f"{preset}.yaml"
    if not path.is_file():
        return
    import yaml

    record = (yaml.safe_load(path.read_text()) or {}).get("calibration") or {}
    made_for = CALIBRATED_KIND.get((record.get("backend"), record.get("mode")))
    if made_for and kind in CALIBRATED_KIND.values() and made_for != kind:
        raise ConfigError(f"preset {preset} was calibrated on {made_for}, but strategy {label} runs on {kind}")
