"""api.calibrate's job and result: a step-model preset measured on a warm backend, or fitted to the steps live
workers executed in runs (lab.calibrate, lab.calibrate_runs), from `batchlab calibrate`'s settings."""
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from batchlab.protocol.errors import ConfigError, shown, term
from batchlab.protocol.modes import BatchingMode

if TYPE_CHECKING:
    import pandas as pd

    from batchlab.lab.progress import CallbackView


@dataclass(slots=True)
class CalibrateResult:
    """The preset written (`preset`: its file, usable wherever a preset name is) and its calibration record:
    what was measured or read, the fit's errors, each step shape's measured and modelled time."""

    preset: Path
    name: str
    record: dict

    @property
    def kind(self) -> str:
        """The backend kind fitted: hf, hf-loop, vllm (or sim, from sim runs)."""
        return {("hf", BatchingMode.CONTINUOUS): "hf-loop"}.get((self.record.get("backend"), self.record.get("mode")),
                                                      str(self.record.get("backend")))

    def points(self) -> "pd.DataFrame":
        """One row per step shape: its size, measured and modelled time, fit and held-out error."""
        import pandas as pd

        return pd.DataFrame(self.record.get("shapes") or [])


def run_calibration(settings: object, out: object, runs: object, view: "CallbackView",
                    changes: dict) -> CalibrateResult:
    """api.calibrate: its settings checked at the edge, then a measurement (or a fit to `runs`) written to the
    preset file."""
    from dataclasses import replace

    from batchlab.protocol.settings import checked_group, load_yaml
    from batchlab.protocol.study_settings import CalibrateSettings

    if isinstance(settings, CalibrateSettings):
        values = settings.model_dump()
    elif isinstance(settings, (str, Path)):
        values = load_yaml(settings)
    elif isinstance(settings, Mapping) or settings is None:
        values = {str(k).replace("-", "_"): v for k, v in (settings or {}).items()}
    else:
        raise ConfigError(f"calibrate's settings are CalibrateSettings, a mapping or a YAML file's path, not "
                          f"{shown(settings)}")
    s = checked_group(CalibrateSettings, {**values, **changes, **({"out": str(out)} if out is not None else {})})
    name = s.name or Path(s.out).stem
    if runs is not None:
        from batchlab.lab.calibrate_runs import calibrate_from

        record = calibrate_from(_folders(runs), kind=s.kind, form=s.form, out=s.out, name=name, weigh=s.weigh,
                                say=view.note)
        return CalibrateResult(Path(s.out), name, record)
    from batchlab.lab.calibrate import FULL, QUICK, run_calibrate

    grid = replace(QUICK if s.quick else FULL)  # a copy: the settings below must not change the module's grid
    if s.batch_sizes:
        grid.rows = _ints(s.batch_sizes, "batch_sizes")
    if s.prompt_lens:
        grid.prompt_lens = _ints(s.prompt_lens, "prompt_lens")
    record = run_calibrate(s.backend, s.model, s.device, s.dtype, s.mode, s.form, s.out, grid, name, say=view.note,
                           on_shape=lambda shape: view.note(shape_line(shape)))
    return CalibrateResult(Path(s.out), name, record)


def shape_line(shape: list) -> str:
    """One measured shape's line: its batch and prompt size, each step kind's time and spread."""
    s = shape[0]
    return f"  B={s.rows:<3} P={s.prompt_len:<4} " + "  ".join(
        f"{x.kind} {1e3 * x.seconds:7.2f} ms ±{x.spread:.0%} ({x.rounds} rounds{'' if x.settled else ', noisy'})"
        for x in shape)


def _ints(text: str, name: str) -> list[int]:
    from batchlab.protocol.setting_groups import said
    from batchlab.protocol.study_settings import CalibrateSettings

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{said(name, schema=CalibrateSettings)} {text!r}: a comma list of whole numbers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{said(name, schema=CalibrateSettings)} {text!r}: whole numbers ≥ 1")
    return values


def _folders(runs: object) -> list[str]:
    """Run or sweep folders, given as paths or as results that hold folders (their `out` or `folder`)."""
    items = runs if isinstance(runs, (list, tuple)) else [runs]
    found = []
    for item in items:
        path = item if isinstance(item, (str, Path)) else getattr(item, "out", None) or getattr(item, "folder", None)
        if not isinstance(path, (str, Path)):
            raise ConfigError(f"{term('--from', 'runs')}: a run or sweep folder (a path, or a result holding one), "
                              f"not {shown(item)}")
        found.append(str(path))
    if not found:
        raise ConfigError(f"{term('--from', 'runs')}: no folder given")
    return found
