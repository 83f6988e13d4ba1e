"""FastContinuousCore against worker.sim.ContinuousCore: the same steps, step for step."""
import numpy as np
import pytest

from batchlab.scheduler.simulator.continuous import FastContinuousCore
from batchlab.worker.backend import Row
from batchlab.worker.sim import ContinuousCore
from batchlab.worker.stepmodel import PRESETS


@pytest.mark.parametrize("preset", ["a100-llama2-7b", "3090-mistral-7b", "cpu-tiny-mistral"])
def test_fast_core_plans_the_same_steps_as_continuous_core(preset):
    rng = np.random.default_rng(7)
    model = PRESETS[preset]
    slow, fast = ContinuousCore(model), FastContinuousCore(model)
    next_id = 0
    for _ in range(400):
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            prompt_len, output_len = int(rng.integers(1, 900)), int(rng.integers(1, 40))
            slow.pending.append(Row(next_id, prompt_len, output_len, [], next_id))
            fast.admit(next_id, prompt_len, output_len)
            next_id += 1
        assert slow.has_work() == fast.has_work()
        if not slow.has_work():
            continue
        duration, ids, _, finished, running, joined = slow.plan_step()
        plan = fast.plan_step()
        assert plan.duration_s == duration  # same integer context, same formula: exactly equal
        assert (plan.finished, plan.running, len(plan.joined)) == (finished, running, joined)
        assert plan.joined == ids[len(ids) - joined:]
    assert next_id > 100
