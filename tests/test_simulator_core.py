"""worker.sim.ContinuousCore (running sums, O(joiners + finishers) a step) against a per-row reference
that walks every running row each step: the same steps, step for step, with and without a row cap."""
from dataclasses import dataclass

import numpy as np
import pytest

from batchlab.worker.sim import ContinuousCore
from batchlab.worker.stepmodel import PRESETS, StepModel


@dataclass
class _Row:
    request_id: int
    prompt_len: int
    output_len: int
    generated: int = 0


@dataclass
class ReferenceCore:
    """The continuous step rules read literally: joiners (up to the cap) are prefilled in the step, every
    running row yields one token, a row leaves once it has max(output_len, 1) tokens."""

    model: StepModel
    max_rows: int = 0
    held_back: int = 0

    def __post_init__(self) -> None:
        self.pending: list[_Row] = []
        self.running: list[_Row] = []

    def step(self) -> tuple[float, list[int], list[int], list[int], list[int]]:
        """(duration_s, joined, finished, request_ids, token_indices) of one step."""
        room = max(0, self.max_rows - len(self.running)) if self.max_rows else len(self.pending)
        joiners, self.pending = self.pending[:room], self.pending[room:]
        self.held_back += len(self.pending)
        context = sum(r.prompt_len + r.generated for r in self.running)
        duration = self.model.decode_step_s(context) if self.running else 0.0
        duration += self.model.prefill_s(sum(r.prompt_len for r in joiners))
        self.running += joiners
        ids, idx = [r.request_id for r in self.running], [r.generated for r in self.running]
        for r in self.running:
            r.generated += 1
        finished = [r.request_id for r in self.running if r.generated >= r.output_len]
        self.running = [r for r in self.running if r.generated < r.output_len]
        return duration, [r.request_id for r in joiners], finished, ids, idx


@pytest.mark.parametrize("max_rows", [0, 3])
@pytest.mark.parametrize("preset", ["a100-llama2-7b", "3090-mistral-7b", "cpu-tiny-mistral"])
def test_core_plans_the_same_steps_as_the_per_row_reference(preset, max_rows):
    rng = np.random.default_rng(7)
    model = PRESETS[preset]
    ref, core = ReferenceCore(model, max_rows), ContinuousCore(model, max_rows=max_rows)
    next_id, steps = 0, 0
    for _ in range(400):
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            prompt_len, output_len = int(rng.integers(1, 900)), int(rng.integers(0, 40))
            ref.pending.append(_Row(next_id, prompt_len, output_len))
            core.admit(next_id, prompt_len, output_len)
            next_id += 1
        assert core.has_work() == bool(ref.pending or ref.running)
        if not core.has_work():
            continue
        duration, joined, finished, ids, idx = ref.step()
        plan = core.plan_step(tokens=True)
        assert plan.step == steps
        assert plan.duration_s == duration  # same integer context, same formula: exactly equal
        assert (plan.joined, plan.finished, plan.running) == (joined, finished, len(ids))
        assert (plan.request_ids, plan.token_indices) == (ids, idx)
        assert core.held_back == ref.held_back
        steps += 1
    assert next_id > 100 and steps > 100
    assert (core.held_back > 0) == (max_rows > 0)  # the cap did bind in the capped run


def test_a_plan_without_tokens_lists_no_rows_and_abort_drops_every_row():
    core = ContinuousCore(PRESETS["a100-llama2-7b"])
    core.admit(0, 10, 5)
    core.admit(1, 20, 1)
    plan = core.plan_step()
    assert (plan.joined, plan.finished, plan.running, plan.request_ids) == ([0, 1], [1], 2, [])
    core.admit(2, 5, 5)
    core.abort()
    assert not core.has_work() and core.context_tokens == 0
