"""vLLM V0's default scheduler in step time: prompt-only steps, a paged KV pool, preemption by recompute.

The timing core for engines whose model says `prefill_alone` (vLLM 0.4.1 and 0.6.0, chunked prefill off: 0.4.1's
server default, 0.6.0's with multi-step scheduling, whose ten-step decode rounds are not modelled), for the live
`sim` worker and the simulator alike; worker.sim.make_core picks it. The rules are vLLM's own
(vllm/core/scheduler.py, Scheduler._schedule_default; vllm/core/block_manager_v1.py):

- a step first schedules waiting sequences, oldest first, as whole prompts, while each fits the step's token budget
  (--max-num-batched-tokens), the row cap (--max-num-seqs, running ones counted) and the free KV blocks (a
  prompt's ceil(len / 16) blocks, leaving the 1% watermark free); the first that does not fit stops the scan;
- a step that scheduled any prompt runs them alone ("Don't schedule decodes if prefills are scheduled"): the
  running rows wait for the next step; each prompt yields its next token at the step's end;
- otherwise every running row decodes one token. Before that, oldest first, each row needs one free block
  (can_append_slots' heuristic) and takes one when its next token starts a block; when none is free the newest
  running row is preempted: its blocks are freed and it goes back to the front of the waiting queue, to be
  prefilled again over its prompt and the tokens it generated (RECOMPUTE, a single-sequence request's mode).

`kv_tokens` 0 leaves the pool unbounded (the scheduler's credit then keeps the engine within its memory). A prompt
that can never fit (more blocks than the pool less its watermark) runs alone when nothing else does (vLLM
refuses it; the simulator has no such failure).

Rows keep their token clock in decode steps (prompt-only steps give running rows nothing), so a step costs
O(prompts scheduled + finishers + rows starting a block), not O(running), except on a preemption.
"""
import math
from collections import deque
from dataclasses import dataclass, field

from batchlab.worker.hf.chunks import chunk_shape
from batchlab.worker.step_plan import StepPlan
from batchlab.worker.stepmodel import StepModel

KV_BLOCK_TOKENS = 16  # vLLM's default --block-size
WATERMARK = 0.01  # BlockSpaceManagerV1's watermark: the share of the blocks a new prompt must leave free


@dataclass(slots=True)
class V0Sequence:
    """One request in the engine. A running row's segment started with a prefill of `computed` tokens (its prompt
    and the tokens it had generated before a preemption) at step `prefill_step`, then decodes from decode index
    `d0`; `generated` counts its tokens up to and including that prefill's."""

    request_id: int
    key: int  # arrival order at the engine: vLLM's FCFS priority, kept through a preemption
    prompt_len: int
    output_len: int  # at least 1
    generated: int = 0
    computed: int = 0
    d0: int = 0
    prefill_step: int = 0
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (prefill step, first decode index, decodes)

    def length(self) -> int:
        """Tokens a (re)prefill computes: the prompt and the tokens generated so far."""
        return self.prompt_len + self.generated


@dataclass
class V0Core:
    """vLLM V0's step rules (module docstring), with the same interface as worker.sim.ContinuousCore."""

    model: StepModel
    max_rows: int = 0  # --max-num-seqs; 0: no cap
    kv_tokens: int = 0  # the KV pool; 0: unbounded
    held_back: int = 0  # prompts that waited for a free row (the cap bound)
    preempted: int = 0  # preemptions so far
    every_step = False  # a running row yields no token in a prompt-only step: plans carry each finisher's steps

    def __post_init__(self) -> None:
        self.total_blocks = self.kv_tokens // KV_BLOCK_TOKENS if self.kv_tokens else 0
        self.free_blocks = self.total_blocks
        self.watermark_blocks = int(WATERMARK * self.total_blocks)
        self.step_no = 0
        self.keys = 0
        self.waiting: deque[V0Sequence] = deque()
        self.running: dict[int, V0Sequence] = {}  # key -> row
        self.decode_steps: list[int] = []  # the step number of each decode step, by decode index
        self.finishing: dict[int, list[int]] = {}  # decode index -> keys whose last token it yields
        self.starting_block: list[set[int]] = [set() for _ in range(KV_BLOCK_TOKENS)]  # by decode index mod 16
        self.context_tokens = 0  # Σ over running rows of the tokens their next decode attends over

    def admit(self, request_id: int, prompt_len: int, output_len: int) -> None:
        """The request joins the waiting queue's back."""
        self.waiting.append(V0Sequence(request_id, self.keys, prompt_len, max(output_len, 1)))
        self.keys += 1

    def has_work(self) -> bool:
        """True while any request waits or runs."""
        return bool(self.waiting or self.running)

    def plan_step(self, tokens: bool = False) -> StepPlan:
        """Advance one step: a prompt-only step when any waiting prompt fits, else a decode step; with `tokens`,
        also list each row's token index (O(running))."""
        chosen = self._schedule_prompts()
        plan = self._prefill(chosen, tokens) if chosen else self._decode(tokens)
        self.step_no += 1
        return plan

    def abort(self) -> None:
        """Drop every request, waiting or running (none is stepped again)."""
        self.__post_init__()

    # --- prompt-only steps ------------------------------------------------------------------------------------
    def _schedule_prompts(self) -> list[V0Sequence]:
        """The waiting sequences this step prefills (Scheduler._schedule_prefills, chunking off)."""
        budget, chosen, tokens = self.model.step_tokens, [], 0
        while self.waiting:
            seq = self.waiting[0]
            n, blocks = seq.length(), math.ceil(seq.length() / KV_BLOCK_TOKENS)
            alone = not chosen and not self.running  # nothing else could ever free room for it
            if self.total_blocks and self.free_blocks - blocks < self.watermark_blocks and not alone:
                break
            if budget and tokens + n > budget and not alone:
                break
            if self.max_rows and len(self.running) + len(chosen) >= self.max_rows:
                self.held_back += len(self.waiting)
                break
            self.waiting.popleft()
            self.free_blocks -= blocks if self.total_blocks else 0
            chosen.append(seq)
            tokens += n
        return chosen

    def _prefill(self, chosen: list[V0Sequence], tokens: bool) -> StepPlan:
        """Run the chosen prompts alone; each yields its next token; those with all their tokens leave."""
        lengths = [s.length() for s in chosen]
        chunks = chunk_shape([0] * len(lengths), lengths)  # every prompt whole, from its start (a recompute too)
        duration = self.model.prefill_s(sum(lengths), len(chosen), chunks[2])
        step = self.step_no
        plan = StepPlan(step, duration, [s.request_id for s in chosen if s.generated == 0], [], len(chosen),
                        sum(lengths), *chunks)
        if tokens:
            plan.request_ids = [s.request_id for s in chosen]
            plan.token_indices = [s.generated for s in chosen]
        decode_index = len(self.decode_steps)  # the next decode step's
        for seq, n in zip(chosen, lengths):
            seq.computed, seq.prefill_step, seq.d0 = n, step, decode_index
            seq.generated += 1
            left = seq.output_len - seq.generated
            if left == 0:
                self._leave(seq, 0, plan)
                continue
            self.running[seq.key] = seq
            self.finishing.setdefault(decode_index + left - 1, []).append(seq.key)
            # its d-th decode (d = 0, 1, ...) writes position n + d: a new block when that is a multiple of 16
            self.starting_block[(decode_index - n) % KV_BLOCK_TOKENS].add(seq.key)
            self.context_tokens += n + 1
        return plan

    # --- decode steps ----------------------------------------------------------------------------------------
    def _decode(self, tokens: bool) -> StepPlan:
        """Every running row decodes one token (after any preemption its blocks force); finishers leave."""
        index = len(self.decode_steps)
        if self.total_blocks:
            self._take_blocks(index)
        rows = len(self.running)
        duration = self.model.decode_step_s(self.context_tokens, rows) if rows else 0.0
        plan = StepPlan(self.step_no, duration, [], [], rows, 0)
        if tokens:
            plan.request_ids = [s.request_id for s in self.running.values()]
            plan.token_indices = [s.generated + index - s.d0 for s in self.running.values()]
        self.decode_steps.append(self.step_no)
        self.context_tokens += rows
        for key in self.finishing.pop(index, []):
            seq = self.running.pop(key)
            self._leave(seq, index - seq.d0 + 1, plan)
        return plan

    def _take_blocks(self, index: int) -> None:
        """The blocks this decode step's rows need: one each for the rows whose token starts a block. When every
        row, oldest first, finds a free block (can_append_slots), take them; else preempt newest rows first."""
        starting = self.starting_block[index % KV_BLOCK_TOKENS]
        newest = max(self.running, default=-1)
        if self.free_blocks - len(starting) + (newest in starting) >= 1:  # the newest row's check is the tightest
            self.free_blocks -= len(starting)
            return
        order = deque(sorted(self.running))
        while order:
            key = order.popleft()
            while self.free_blocks < 1 and key in self.running:
                self._preempt(order.pop() if order else key, index)
            if key in self.running and key in starting:
                self.free_blocks -= 1

    def _preempt(self, key: int, index: int) -> None:
        """Free a running row's blocks and send it back to the waiting queue's front, to be recomputed."""
        seq = self.running.pop(key)
        done = index - seq.d0  # the decodes it ran in this segment
        self.finishing[seq.d0 + seq.output_len - seq.generated - 1].remove(key)
        self._release(seq, done)
        seq.segments.append((seq.prefill_step, seq.d0, done))
        seq.generated += done
        self.waiting.appendleft(seq)
        self.preempted += 1

    def _leave(self, seq: V0Sequence, decodes: int, plan: StepPlan) -> None:
        """A row yielded its last token in this step, `decodes` decodes into its segment (0: in its prefill)."""
        plan.finished.append(seq.request_id)
        seq.segments.append((seq.prefill_step, seq.d0, decodes))
        plan.token_steps[seq.request_id] = self._steps(seq)
        if decodes:
            self._release(seq, decodes)
        elif self.total_blocks:  # it never ran a decode: only its prefill's blocks
            self.free_blocks += math.ceil(seq.computed / KV_BLOCK_TOKENS)

    def _release(self, seq: V0Sequence, decodes: int) -> None:
        """Give back a running row's blocks, its context and its block-bucket entry, `decodes` decodes in."""
        written = seq.computed + decodes
        if self.total_blocks:
            self.free_blocks += math.ceil(written / KV_BLOCK_TOKENS)
        self.context_tokens -= written + 1
        self.starting_block[(seq.d0 - seq.computed) % KV_BLOCK_TOKENS].discard(seq.key)

    def _steps(self, seq: V0Sequence) -> list[int]:
        """The step numbers of a row's tokens, segment by segment: its prefill's, then its decodes'."""
        out = []
        for prefill_step, d0, decodes in seq.segments:
            out.append(prefill_step)
            out += self.decode_steps[d0: d0 + decodes]
        return out
