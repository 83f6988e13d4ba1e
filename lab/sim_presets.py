"""Which step model each grid entry of `batchlab simulate` plays: one preset per backend kind.

A live grid may run its strategies on different engines (HF generate(), the HF continuous loop, vLLM),
each with its own step times, so one preset cannot stand for all of them. `--preset` (or the YAML's
`preset:`) is either one preset, allowed when every entry runs on one kind, or a comma list of
KIND=PRESET pairs, e.g. `hf=presets/hf.yaml,hf-loop=presets/hf-loop.yaml,vllm=presets/vllm.yaml`.
A grid entry's own `preset:` wins over both. An entry whose kind has no preset is refused, naming it.

Kinds: `hf` (static generate()), `hf-loop` (hf with a continuous strategy), `vllm`, and the other
backends by name (`sim`, `echo`, `openai`). A `sim` grid needs no preset (the run's own default).
"""
from pathlib import Path

from batchlab.runner.config import checked_config
from batchlab.lab.sweep_plan import Plan
from batchlab.protocol.settings import ConfigError
from batchlab.scheduler.strategies import resolve

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
