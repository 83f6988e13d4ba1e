"""worker.vllm_v0.V0Core (vLLM V0's scheduler in step time, O(prompts + finishers) a step) against a literal per-row
reading of vLLM's Scheduler._schedule_default and BlockSpaceManagerV1: the same steps, tokens and preemptions, step
for step, with a pool small enough to preempt, with and without a row cap and a token budget."""
import math
from dataclasses import dataclass, replace

import numpy as np
import pytest

from batchlab.worker.sim import ContinuousCore, make_core
from batchlab.worker.stepmodel import StepModel, get_preset
from batchlab.worker.vllm_v0 import KV_BLOCK_TOKENS, V0Core

MODEL = replace(get_preset("a100-llama2-7b"), prefill_alone=True)


@dataclass
class _Seq:
    request_id: int
    key: int
    prompt_len: int
    output_len: int
    generated: int = 0
    blocks: int = 0  # physical blocks held
    written: int = 0  # tokens in its KV cache


class ReferenceV0:
    """vLLM V0 read literally: every running row visited every step."""

    def __init__(self, model: StepModel, max_rows: int, kv_tokens: int) -> None:
        self.model, self.max_rows = model, max_rows
        self.total = kv_tokens // KV_BLOCK_TOKENS
        self.free, self.watermark = self.total, int(0.01 * self.total)
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []  # by arrival
        self.keys = self.preempted = 0

    def admit(self, request_id: int, prompt_len: int, output_len: int) -> None:
        self.waiting.append(_Seq(request_id, self.keys, prompt_len, max(output_len, 1)))
        self.keys += 1

    def step(self) -> tuple[float, list[int], list[int], list[int], list[int]]:
        """(duration_s, finished, request_ids, token_indices, preempted so far) of one step."""
        chosen, tokens = [], 0
        for seq in list(self.waiting):
            n = seq.prompt_len + seq.generated
            blocks = math.ceil(n / KV_BLOCK_TOKENS)
            alone = not chosen and not self.running
            no_room = self.total and self.free - blocks < self.watermark
            if (no_room or tokens + n > (self.model.step_tokens or math.inf)) and not alone:
                break
            if self.max_rows and len(self.running) + len(chosen) >= self.max_rows:
                break
            self.waiting.remove(seq)
            self.free -= blocks if self.total else 0
            seq.blocks, seq.written = blocks, n
            chosen.append((seq, n))
            tokens += n
        if chosen:
            lengths = [n for _, n in chosen]
            duration = self.model.prefill_s(sum(lengths), len(lengths), sum(n * n for n in lengths))
            yielding = [s for s, _ in chosen]
            self.running = sorted(self.running + yielding, key=lambda s: s.key)
        else:
            queue = list(self.running)
            kept = []
            while queue:
                seq = queue.pop(0)
                preempted_self = False
                while self.total and self.free < 1:
                    victim = queue.pop() if queue else seq
                    self._preempt(victim)
                    if victim is seq:
                        preempted_self = True
                        break
                if preempted_self:
                    break
                if self.total and seq.written % KV_BLOCK_TOKENS == 0:  # the token it writes now starts a block
                    self.free -= 1
                    seq.blocks += 1
                kept.append(seq)
            self.running = kept
            context = sum(s.written + 1 for s in self.running)
            duration = self.model.decode_step_s(context, len(self.running)) if self.running else 0.0
            for s in self.running:
                s.written += 1
            yielding = list(self.running)
        ids, indices, finished = [s.request_id for s in yielding], [s.generated for s in yielding], []
        for s in yielding:
            s.generated += 1
            if s.generated == s.output_len:
                finished.append(s.request_id)
                self.running.remove(s)
                self.free += s.blocks
        return duration, finished, ids, indices, self.preempted

    def _preempt(self, seq: _Seq) -> None:
        self.running.remove(seq) if seq in self.running else None
        self.free += seq.blocks
        seq.blocks = seq.written = 0
        self.waiting.insert(0, seq)
        self.preempted += 1


@pytest.mark.parametrize("max_rows,kv_tokens,step_tokens", [(0, 0, 0), (0, 2000, 0), (6, 1600, 0), (0, 1600, 300),
                                                             (4, 0, 200)])
def test_core_matches_the_literal_scheduler_step_for_step(max_rows, kv_tokens, step_tokens) -> None:
    rng = np.random.default_rng(7)
    model = replace(MODEL, step_tokens=step_tokens)
    ref, core = ReferenceV0(model, max_rows, kv_tokens), V0Core(model, max_rows=max_rows, kv_tokens=kv_tokens)
    arrivals = {int(s): [] for s in rng.integers(0, 120, 40)}
    for rid, at in enumerate(sorted(rng.integers(0, 120, 40))):
        arrivals.setdefault(int(at), []).append((rid, int(rng.integers(1, 200)), int(rng.integers(1, 90))))
    steps: dict[int, list[int]] = {}
    for step in range(2000):
        for rid, p, o in arrivals.get(step, []):
            ref.admit(rid, p, o)
            core.admit(rid, p, o)
        if not (core.has_work() or ref.waiting or ref.running):
            continue
        duration, finished, ids, indices, preempted = ref.step()
        plan = core.plan_step(tokens=True)
        assert plan.duration_s == pytest.approx(duration, rel=1e-12)
        assert sorted(plan.finished) == sorted(finished)
        assert sorted(zip(plan.request_ids, plan.token_indices)) == sorted(zip(ids, indices))
        assert core.preempted == preempted
        for rid in ids:
            steps.setdefault(rid, []).append(plan.step)
        for rid in plan.finished:  # a finisher's token steps, as the simulator records them
            assert plan.token_steps[rid] == steps[rid]
    assert not core.has_work() and core.free_blocks == core.total_blocks and core.context_tokens == 0
    assert (core.preempted > 0) == (kv_tokens > 0 and max_rows == 0)  # a small pool without a row cap ran out


def test_a_step_with_a_waiting_prompt_runs_it_alone() -> None:
    core = V0Core(MODEL)
    core.admit(0, 100, 5)
    first = core.plan_step()
    core.admit(1, 50, 5)
    second, third = core.plan_step(tokens=True), core.plan_step(tokens=True)
    assert first.joined == [0] and second.joined == [1] and third.joined == []
    assert second.request_ids == [1] and second.duration_s == pytest.approx(MODEL.prefill_s(50, 1, 2500))
    assert sorted(third.request_ids) == [0, 1] and third.prefill_tokens == 0  # both decode: row 0 waited a step


def test_no_room_preempts_the_newest_row_which_is_recomputed_with_its_tokens() -> None:
    # 5 blocks of 16 tokens: two 32-token prompts take 4 (the watermark is 0); at the first decode each one's token
    # starts a block: the older takes the last free one, the newer finds none and, being the newest, is preempted
    core = V0Core(replace(MODEL, step_tokens=0), kv_tokens=5 * KV_BLOCK_TOKENS)
    core.admit(0, 32, 2)
    core.admit(1, 32, 40)
    assert core.plan_step().joined == [0, 1]
    decode, again = core.plan_step(tokens=True), core.plan_step(tokens=True)
    assert core.preempted == 1 and decode.request_ids == [0] and decode.finished == [0]
    # row 0 left: row 1 is prefilled again over its prompt and its one token, and yields its second token
    assert again.request_ids == [1] and again.token_indices == [1] and again.prefill_tokens == 33
    assert again.joined == []  # not a new row: its first token came long ago


def test_make_core_picks_the_v0_core_for_a_prefill_alone_model_with_its_pool() -> None:
    core = make_core(MODEL, 8, 1000 * MODEL.kv_bytes_per_token)
    assert isinstance(core, V0Core) and core.kv_tokens == 1000 and core.max_rows == 8
    assert isinstance(make_core(replace(MODEL, prefill_alone=False), 8, 1000), ContinuousCore)
