"""worker.sim.ContinuousCore (running sums, O(joiners + finishers) a step) against a per-row reference
that walks every running row each step: the same steps, step for step, with and without a row cap, with
and without a per-step token budget (chunked prefill)."""
from dataclasses import dataclass, replace

import numpy as np
import pytest

from batchlab.worker.sim import ContinuousCore
from batchlab.worker.stepmodel import PRESETS, StepModel, get_preset


@dataclass
class _Row:
    request_id: int
    prompt_len: int
    output_len: int
    generated: int = 0
    filled: int = 0


@dataclass
class ReferenceCore:
    """The continuous step rules read literally: joiners take free rows (up to the cap, prefilling rows
    counted); the running rows' decodes take one token each of the budget, the rest goes to the prefilling
    prompts oldest first (a part of the next one when it does not fit); a row whose prompt is all prefilled
    yields its first token in that step, then one a step, and leaves once it has max(output_len, 1)."""

    model: StepModel
    max_rows: int = 0
    held_back: int = 0

    def __post_init__(self) -> None:
        self.pending: list[_Row] = []
        self.prefilling: list[_Row] = []
        self.running: list[_Row] = []

    def step(self) -> tuple[float, list[int], list[int], list[int], list[int]]:
        """(duration_s, joined, finished, request_ids, token_indices) of one step."""
        taken = len(self.running) + len(self.prefilling)
        room = max(0, self.max_rows - taken) if self.max_rows else len(self.pending)
        self.prefilling += self.pending[:room]
        self.pending = self.pending[room:]
        self.held_back += len(self.pending)
        context = sum(r.prompt_len + r.generated for r in self.running)
        duration = self.model.decode_step_s(context, len(self.running)) if self.running else 0.0
        left = self.model.step_tokens - len(self.running) if self.model.step_tokens else 10**9
        tokens = rows = pairs = 0
        joiners = []
        for r in self.prefilling:
            n = min(r.prompt_len - r.filled, left)
            if n <= 0:
                break
            tokens, rows, pairs = tokens + n, rows + 1, pairs + (r.filled + n) ** 2 - r.filled ** 2
            r.filled, left = r.filled + n, left - n
            if r.filled == r.prompt_len:
                joiners.append(r)
        self.prefilling = self.prefilling[len(joiners):]
        duration = self.model.fused_s(duration, self.model.prefill_s(tokens, rows, pairs) if tokens else 0.0)
        self.running += joiners
        ids, idx = [r.request_id for r in self.running], [r.generated for r in self.running]
        for r in self.running:
            r.generated += 1
        finished = [r.request_id for r in self.running if r.generated >= r.output_len]
        self.running = [r for r in self.running if r.generated < r.output_len]
        return duration, [r.request_id for r in joiners], finished, ids, idx


@pytest.mark.parametrize("step_tokens", [0, 300])
@pytest.mark.parametrize("max_rows", [0, 3])
@pytest.mark.parametrize("preset", ["a100-llama2-7b", "3090-mistral-7b", "cpu-tiny-mistral"])
def test_core_plans_the_same_steps_as_the_per_row_reference(preset, max_rows, step_tokens):
    rng = np.random.default_rng(7)
    model = replace(get_preset(preset), step_tokens=step_tokens, fused=bool(step_tokens), padded=False)
    ref, core = ReferenceCore(model, max_rows), ContinuousCore(model, max_rows=max_rows)
    next_id, steps, chunked = 0, 0, 0
    for _ in range(400):
        for _ in range(int(rng.integers(0, 3)) if rng.random() < 0.4 else 0):
            prompt_len, output_len = int(rng.integers(1, 900)), int(rng.integers(0, 40))
            ref.pending.append(_Row(next_id, prompt_len, output_len))
            core.admit(next_id, prompt_len, output_len)
            next_id += 1
        assert core.has_work() == bool(ref.pending or ref.prefilling or ref.running)
        if not core.has_work():
            continue
        duration, joined, finished, ids, idx = ref.step()
        plan = core.plan_step(tokens=True)
        assert plan.step == steps
        assert plan.duration_s == pytest.approx(duration, rel=1e-12)  # same integer counts, same formula
        assert (plan.joined, plan.finished, plan.running) == (joined, finished, len(ids))
        assert (plan.request_ids, plan.token_indices) == (ids, idx)
        assert core.held_back == ref.held_back
        chunked += sum(0 < r.filled < r.prompt_len for r in ref.prefilling)
        steps += 1
    assert next_id > 100 and steps > 100
    assert (core.held_back > 0) == (max_rows > 0)  # the cap did bind in the capped run
    assert not step_tokens or chunked > 20  # the budget did split prompts over several steps


def test_a_plan_without_tokens_lists_no_rows_and_abort_drops_every_row():
    core = ContinuousCore(PRESETS["a100-llama2-7b"])
    core.admit(0, 10, 5)
    core.admit(1, 20, 1)
    plan = core.plan_step()
    assert (plan.joined, plan.finished, plan.running, plan.request_ids) == ([0, 1], [1], 2, [])
    core.admit(2, 5, 5)
    core.abort()
    assert not core.has_work() and core.context_tokens == 0


@pytest.mark.parametrize("padded", [False, True], ids=["packed", "padded (the HF loop's slots)"])
def test_a_budget_prefills_a_long_prompt_over_several_steps_and_delays_its_first_token(padded):
    """Budget 64, two rows decoding: a 200-token prompt takes 62 + 62 + 62 + 14 tokens, so its first token
    ends the fourth step, and each of those steps costs the decodes plus its chunk (attending over the
    chunks before it), where without a budget it would end the first."""
    model = replace(get_preset("cpu-tiny-mistral"), step_tokens=64, fused=False, padded=padded)
    core = ContinuousCore(model, max_rows=4)
    core.admit(0, 10, 50)
    core.admit(1, 10, 50)
    core.plan_step()  # the two short prompts, whole
    core.admit(2, 200, 5)
    plans = [core.plan_step() for _ in range(4)]
    assert [p.prefill_tokens for p in plans] == [62, 62, 62, 14]
    assert [p.joined for p in plans] == [[], [], [], [2]]
    assert [p.running for p in plans] == [2, 2, 2, 3]
    pairs = [(f + n) ** 2 - f ** 2 for f, n in ((0, 62), (62, 62), (124, 62), (186, 14))]
    for k, (p, n, pair) in enumerate(zip(plans, [62, 62, 62, 14], pairs)):
        context = 2 * 10 + 2 * (k + 1)  # two rows of 10 prompt tokens, one token each a step so far
        prefill = model.prefill_s(n, 1) if padded else model.prefill_s(n, 1, pair)
        assert p.duration_s == pytest.approx(model.decode_step_s(context, 2) + prefill)
    whole = ContinuousCore(replace(model, step_tokens=0), max_rows=4)
    whole.admit(2, 200, 5)
    assert whole.plan_step().joined == [2]
