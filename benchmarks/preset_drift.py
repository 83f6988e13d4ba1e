"""Does a shipped CPU preset still describe the worker it was fitted to? A few shapes measured now, each kind's
mean |error| printed against the held-out error its calibration record states (worker/presets/NAME.yaml, fitted
from live runs: a worker measured alone in this process runs faster than one sharing the cores with traffic,
scheduler and collector, so read a drift toward "faster" with that in mind); exit code 1 when one drifted past
it (refit: batchlab calibrate --from RUNS). A benchmark, not a test: step times depend on the machine
(this project's VMs change CPU between sessions) and mean something only on a quiet one.

    python benchmarks/preset_drift.py [--force]    # --force: measure even under load"""
import os
import random
import statistics
import sys

from batchlab.lab.calibrate import ShapeGrid, errors, measure_shape
import yaml

from batchlab.worker.stepmodel import PRESET_DIR, get_preset

# the static HF preset (this script measures generate()'s steps) -> the backend settings it was fitted on
STATED = {"cpu-tiny-mistral": {"model": "tiny-mistral", "device": "cpu"}}
SHAPES = [(1, 64), (4, 64), (2, 192)]  # (rows, prompt_len): inside the preset's fitted range
GRID = ShapeGrid([1, 2, 4], [64, 192], steps=8, min_rounds=3, max_rounds=5)
QUIET_LOAD_PER_CPU = 0.75


def drifted(name: str) -> list[str]:
    """The kinds of `name`'s steps whose mean |error| now exceeds what the preset states (printed as measured)."""
    from batchlab.worker.hf.static import HFBackend, HFSettings

    settings = STATED[name]
    record = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())["calibration"]["held_out_error"]
    stated = {kind: record[kind]["mean_abs"] for kind in ("decode", "prefill")}
    backend = HFBackend(HFSettings(max_batch_size=4, **settings))
    backend.warmup()
    try:
        rng = random.Random(0)
        samples = [s for rows, p in SHAPES for s in measure_shape(backend, rows, p, GRID, rng, stepping=False)]
    finally:
        backend.close()
    out = []
    for kind, limit in stated.items():
        errs = [abs(e) for s, e in zip(samples, errors(get_preset(name), samples)) if s.kind == kind]
        print(f"{name} {kind}: mean |error| {statistics.fmean(errs):.1%} (stated {limit:.0%})")
        out += [kind] if statistics.fmean(errs) > limit else []
    return out


def main() -> int:
    """Measure every preset in STATED; 1 when one drifted, 2 when the machine is too busy to tell."""
    load = os.getloadavg()[0]
    if load > QUIET_LOAD_PER_CPU * (os.cpu_count() or 1) and "--force" not in sys.argv:
        print(f"load average {load:.1f} on {os.cpu_count()} CPUs: too busy to measure step times (--force)")
        return 2
    bad = [f"{name} {kind}" for name in sorted(STATED) for kind in drifted(name)]
    for what in bad:
        print(f"drifted: {what} steps; refit the preset (batchlab calibrate)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
