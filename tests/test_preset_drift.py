"""A shipped CPU preset still describes the worker it was fitted to: a few shapes measured now, each kind's mean
|error| within the error the preset states (worker/stepmodel.py's comment beside it). Slow; meaningful only on a
quiet machine (skipped under load: a shared machine's step times say nothing about the preset)."""
import os
import random
import statistics

import pytest

from batchlab.worker.calibrate import errors
from batchlab.worker.calibrate_measure import Grid, measure_shape
from batchlab.worker.stepmodel import PRESETS

# preset -> (backend settings it was fitted on, the mean |relative error| per kind it states)
STATED = {"cpu-tiny-mistral": ({"model": "tiny-mistral", "device": "cpu"}, {"decode": 0.35, "prefill": 0.38})}
SHAPES = [(1, 64), (4, 64), (2, 192)]  # (rows, prompt_len): inside the preset's fitted range
GRID = Grid([1, 2, 4], [64, 192], steps=8, min_rounds=3, max_rounds=5)
QUIET_LOAD_PER_CPU = 0.75


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STATED))
def test_a_shipped_cpu_preset_has_not_drifted_from_what_the_worker_measures(name):
    load = os.getloadavg()[0]
    if load > QUIET_LOAD_PER_CPU * (os.cpu_count() or 1):
        pytest.skip(f"load average {load:.1f} on {os.cpu_count()} CPUs: too busy to measure step times")
    from batchlab.worker.hf import HFBackend, HFSettings

    settings, stated = STATED[name]
    backend = HFBackend(HFSettings(max_batch_size=4, **settings))
    backend.warmup()
    try:
        rng = random.Random(0)
        samples = [s for rows, p in SHAPES for s in measure_shape(backend, rows, p, GRID, rng, stepping=False)]
    finally:
        backend.close()
    for kind, limit in stated.items():
        errs = [abs(e) for s, e in zip(samples, errors(PRESETS[name], samples)) if s.kind == kind]
        print(f"{name} {kind}: mean |error| {statistics.fmean(errs):.1%} (stated {limit:.0%})")
        assert statistics.fmean(errs) <= limit, f"{name}'s {kind} steps drifted: refit it (batchlab calibrate)"
