"""The `sim` and `echo` backends: the step-time model played in real time (no model).

The timing rules live in pure code (`static_step_durations`, `ContinuousCore`) that the discrete-event
simulator reuses in virtual time; `sim_info` is what both kinds of worker report.
"""
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from batchlab.protocol.clock import now, sleep_until
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.settings import parse_bytes
from batchlab.worker.backend import Backend, BackendInfo, BackendRequest, StepOutput, lockstep_output
from batchlab.worker.hf.chunks import chunk_shape, pads_chunks, plan_chunks
from batchlab.worker.machine_noise import MachineNoise, of_config
from batchlab.worker.step_plan import StepPlan
from batchlab.worker.stepmodel import StepModel, get_preset, speed_factor
from batchlab.worker.vllm_v0 import V0Core

FAKE_VOCAB = 32000


def fake_token(request_id: int, index: int) -> int:
    """A deterministic token id for row `request_id`'s `index`-th output token."""
    return (request_id * 7919 + index * 104729) % FAKE_VOCAB


def static_step_durations(rows: list[BackendRequest], model: StepModel) -> list[float]:
    """Durations of a padded lockstep batch (generate()): step 0 is the prefill (first token), then decode
    steps; every row, padded to the longest prompt, rides along until the longest output ends."""
    b, p_max = len(rows), max(r.prompt_len for r in rows)
    o_max = max(r.output_len for r in rows)
    durations = [model.prefill_s(b * p_max, b)]
    durations += [model.decode_step_s(b * (p_max + i), b) for i in range(1, o_max)]
    return durations


def step_ends(start_s: float, durations: list[float], noise=None, origin_s: float = 0.0) -> list[float]:
    """When each step of a batch started at start_s ends, each duration scaled by the machine's slowdown at
    its own start (`noise`: a worker.machine_noise.MachineNoise, its time counted from origin_s)."""
    if noise is None:
        return list(itertools.accumulate(durations, initial=start_s))[1:]
    ends, t = [], start_s
    for duration in durations:
        t += duration * (noise.factor(t - origin_s) if noise is not None else 1.0)
        ends.append(t)
    return ends


@dataclass
class ContinuousCore:
    """Iteration-level batching's timing, for the live `sim` worker and the simulator alike.

    Joiners take a free row (at most `max_rows` rows, prefilling ones included) and are prefilled; a row
    yields its first token at the end of the step its prompt's last token is prefilled in, then one token a
    step, and leaves after max(output_len, 1) tokens.

        duration = decode_step_s(Σ_running (prompt_len + generated), running)   [if rows were running]
                   + prefill_s(Σ chunk, chunks, Σ ((filled + chunk)² − filled²))   [the step's chunks]
        (less what a fused forward shares: fused_s; a step with no chunk is a decode step alone, its row count's
        factor applied: StepModel.row_factor)

    With the model's `step_tokens` budget (the HF loop's and vLLM's --max-num-batched-tokens; 0: none) a
    step runs the running rows' decodes first and prefills what is left of the budget, oldest prompt first,
    a longer prompt over several steps (worker.hf.chunks.plan_chunks: the live loop's own plan); without
    one a joiner's whole prompt is prefilled in the step it joins (a chunk is its prompt).

    With a `padded` model (the HF loop: its slot cache, or its padded layout, which has no budget) a step's
    chunks are padded to the longest, unless the model is `fused` and rows decode beside them (the slot cache's
    one packed forward), and a decode step attends over running × the widest row's columns (O(running) per
    step).

    The context is kept as a running sum and rows leave from a per-step list, so a step costs
    O(prefilling + finishers), not O(running).
    """

    model: StepModel
    max_rows: int = 0  # the most rows in a step (the worker's announced cap); 0: no cap
    held_back: int = 0  # joiners that had to wait for a free row (a scheduler over its credit)
    step_no: int = 0  # the next step's number
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (request_id, prompt_len, output_len)
    prefilling: list[list[int]] = field(default_factory=list)  # in a row, prompt partly prefilled: [rid, p, o, filled]
    rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # running: row key -> (request_id, first step)
    context_tokens: int = 0  # Σ (prompt_len + generated) over running rows
    finishing: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # step -> [(row key, kv tokens)]
    keys: int = 0  # rows admitted so far (a row's key: a request id may come back after a failure)
    pad_base: dict[int, int] = field(default_factory=dict)  # padded: row key -> its columns − step number
    every_step = True  # every running row yields a token every step (a row's tokens: consecutive steps)

    def admit(self, request_id: int, prompt_len: int, output_len: int) -> None:
        """The row joins at the next step boundary (or later, while `max_rows` rows run)."""
        self.pending.append((request_id, prompt_len, output_len))

    def has_work(self) -> bool:
        """True while any row waits or runs."""
        return bool(self.pending or self.prefilling or self.rows)

    def plan_step(self, tokens: bool = False) -> StepPlan:
        """Advance one step; with `tokens`, also list each running row's token index (O(running))."""
        step, decoding = self.step_no, len(self.rows)
        decode_s = self._decode_s(step) if self.rows else 0.0  # before the joiners become rows
        if self.pending or self.prefilling:
            done, prefill_s, prefilled, chunks = self._prefill(step)
        else:  # decodes alone: no joiner to admit, no chunk to plan (the steps between arrivals)
            done, prefill_s, prefilled, chunks = [], 0.0, 0, (0, 0, 0)
        if not prefill_s:
            decode_s *= self.model.row_factor(decoding)  # a decode step alone
        duration = self.model.fused_s(decode_s, prefill_s, decoding, prefilled)
        plan = StepPlan(step, duration, [row[0] for row in done], [], len(self.rows), prefilled, *chunks)
        if tokens:
            plan.request_ids = [rid for rid, _ in self.rows.values()]
            plan.token_indices = [step - first for _, first in self.rows.values()]
        self.context_tokens += plan.running  # every running row generated one token
        for key, kv_tokens in self.finishing.pop(step, []):
            plan.finished.append(self.rows.pop(key)[0])
            self.pad_base.pop(key, None)
            self.context_tokens -= kv_tokens
        self.step_no += 1
        return plan

    def _prefill(self, step: int) -> tuple[list[list[int]], float, int, tuple[int, int, int]]:
        """This step's prefill: the joiners admitted to free rows, their chunks planned and run; the rows whose
        prompt it completes (now running), the chunks' time, their prompt tokens and their shape (chunk_shape)."""
        taken = len(self.rows) + len(self.prefilling)
        room = max(0, self.max_rows - taken) if self.max_rows else len(self.pending)
        self.prefilling += [[rid, p, o, 0] for rid, p, o in self.pending[:room]]
        self.pending = self.pending[room:]
        self.held_back += len(self.pending)
        counts = self._chunks()
        done = [row for row, n in zip(self.prefilling, counts) if row[3] + n >= row[1]]
        chunks = chunk_shape([row[3] for row in self.prefilling], counts)
        prefill_s = self._prefill_s(sum(counts), *chunks)  # before the joiners become rows
        for row, n in zip(self.prefilling, counts):
            row[3] += n
        self.prefilling = self.prefilling[len(done):]  # the oldest rows finish their prompts first
        width = max((row[1] for row in done), default=0)
        for rid, prompt_len, output_len, _ in done:
            self.rows[self.keys] = (rid, step)
            if self.model.padded:
                self.pad_base[self.keys] = width - step
            last = step + max(output_len, 1) - 1  # every row yields at least one token
            self.finishing.setdefault(last, []).append((self.keys, prompt_len + max(output_len, 1)))
            self.context_tokens += prompt_len
            self.keys += 1
        return done, prefill_s, sum(counts), chunks

    def _chunks(self) -> list[int]:
        """Prompt tokens each prefilling row (oldest first) runs this step: what the running rows' decodes
        leave of the budget (no budget: every prompt whole)."""
        budget = self.model.step_tokens
        left = budget - len(self.rows) if budget else None
        return plan_chunks(left, [p - filled for _, p, _, filled in self.prefilling])

    def _decode_s(self, step: int) -> float:
        """The running rows' decodes: over their own tokens, or (padded) rows × the widest row (by the terms alone:
        plan_step applies the row count's factor when no prompt runs beside them)."""
        rows = len(self.rows)
        if self.model.padded:
            return self.model.decode_step_s(rows * (max(self.pad_base.values()) + step), rows, alone=False)
        return self.model.decode_step_s(self.context_tokens, rows, alone=False)

    def _prefill_s(self, tokens: int, rows: int, width: int, pairs: int) -> float:
        """The step's chunks (`tokens` in all over `rows` rows, the longest `width`, `pairs` token pairs:
        chunk_shape) in one forward: packed (each chunk attends over its row's earlier chunks), or (padded)
        padded to the longest chunk, unless they run beside decodes in one fused forward, which packs them (the
        HF loop's slot cache: worker.hf.slots.fused_inputs)."""
        if not rows:
            return 0.0
        if pads_chunks(self.model.padded, self.model.fused, bool(self.rows)):
            return self.model.prefill_s(rows * width, rows)
        return self.model.prefill_s(tokens, rows, pairs)

    def abort(self) -> None:
        """Drop every row, waiting or running (none is stepped again)."""
        self.pending, self.prefilling, self.rows, self.finishing = [], [], {}, {}
        self.context_tokens, self.pad_base = 0, {}


def make_core(model: StepModel, max_rows: int = 0, kv_budget_bytes: int = 0):
    """The timing core of a continuous worker playing `model`: vLLM V0's (worker.vllm_v0.V0Core: prompt-only
    steps, its KV pool of `kv_budget_bytes` in blocks) when the model says `prefill_alone`, else ContinuousCore."""
    if model.prefill_alone:
        per_token = model.kv_bytes_per_token
        return V0Core(model, max_rows=max_rows, kv_tokens=kv_budget_bytes // per_token if per_token else 0)
    return ContinuousCore(model, max_rows=max_rows)


def with_budget(model: StepModel, step_tokens: int) -> StepModel:
    """`model` with the run's per-step token budget (--max-num-batched-tokens) when it sets one (0: the
    preset's own)."""
    return replace(model, step_tokens=step_tokens) if step_tokens else model


def run_speed(cfg) -> float:
    """This run's step-time factor from its --speed-noise (1: none), seeded by its seed, repeat and label."""
    return speed_factor(cfg.speed_noise, cfg.seed, cfg.repeat, cfg.label or cfg.strategy)


def sim_info(model: StepModel, mode: str, max_batch_size: int, *, backend: str = "sim",
             model_name: str | None = None, kv_budget_bytes: int = 0, speed: float = 1.0) -> BackendInfo:
    """What a `sim`/`echo` worker playing `model` reports (the simulator's workers report the same);
    `kv_budget_bytes` 0: the model's own budget; `speed`: the run's step-time factor, already in `model`."""
    return BackendInfo(backend=backend, model=model_name or model.name, mode=mode, max_batch_size=max_batch_size,
                       kv_bytes_per_token=model.kv_bytes_per_token,
                       kv_budget_bytes=kv_budget_bytes or model.kv_budget_bytes(), device="simulated",
                       memory_kind="none", facts={"preset": model.as_dict(), "speed_factor": speed})


class SimBackend(Backend):
    """Sleeps for the modelled step times; static (lockstep batches) or continuous mode."""

    def __init__(self, preset: str = "a100-llama2-7b", mode: str = BatchingMode.STATIC, max_batch_size: int = 64,
                 model_name: str | None = None, backend: str = "sim", step_tokens: int = 0,
                 speed: float = 1.0) -> None:
        self.model = with_budget(get_preset(preset), step_tokens).scaled(speed)
        self.info = sim_info(self.model, mode, max_batch_size, backend=backend, model_name=model_name, speed=speed)
        self.core = make_core(self.model, max_batch_size, self.info.kv_budget_bytes)
        self.noise: MachineNoise | None = None  # the machine's slowdown within a run (--speed-drift, --neighbour-*)
        self.origin_s: float | None = None  # the run's first step: the noise's time 0

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "SimBackend":
        """The run's preset, per-step token budget and speed factor (--speed-noise; a warm worker serves one
        run only when it is set: runner.pool.worker_key); --memory-budget, when set, replaces the preset's KV budget."""
        backend = cls(cfg.preset, mode, rows, step_tokens=cfg.max_num_batched_tokens, speed=run_speed(cfg))
        backend.info.kv_budget_bytes = parse_bytes(cfg.memory_budget) or backend.info.kv_budget_bytes
        backend.reset()  # a paged core's pool is the budget just set
        noise = of_config(cfg)
        if noise.active:
            backend.noise = noise
            backend.info.facts["machine_noise"] = noise.facts()
        return backend

    def _origin(self, t: float) -> float:
        if self.origin_s is None:
            self.origin_s = t
        return self.origin_s

    def run_batch(self, rows: list[BackendRequest], on_step: Callable[[StepOutput], None]) -> None:
        """Play a lockstep batch: row r gets a token at steps 0 .. output_len-1."""
        t = now()
        ends = step_ends(t, static_step_durations(rows, self.model), self.noise, self._origin(t))
        for step, end in enumerate(ends):
            start, t = t, end
            sleep_until(t)
            on_step(lockstep_output(rows, step, lambda _i, r: fake_token(r.request_id, step), now(), start))

    def admit(self, rows: list[BackendRequest]) -> None:
        """Rows join at the next step boundary."""
        for r in rows:
            self.core.admit(r.request_id, r.prompt_len, r.output_len)

    def has_work(self) -> bool:
        """True while any admitted row is unfinished."""
        return self.core.has_work()

    def step(self) -> StepOutput | None:
        """One continuous step, played in real time."""
        if not self.core.has_work():
            return None
        start = now()
        plan = self.core.plan_step(tokens=True)
        sleep_until(step_ends(start, [plan.duration_s], self.noise, self._origin(start))[0])
        return StepOutput(time=now(), start_time=start, request_ids=plan.request_ids,
                          token_ids=[fake_token(r, i) for r, i in zip(plan.request_ids, plan.token_indices)],
                          finished=plan.finished, running=plan.running, joined=len(plan.joined),
                          prefill_tokens=plan.prefill_tokens, prefill_rows=plan.prefill_rows,
                          prefill_width=plan.prefill_width, prefill_pairs=plan.prefill_pairs)

    def abort_all(self) -> None:
        """Drop every admitted row (after a failed step): none is stepped again."""
        self.core.abort()

    def reset(self) -> None:
        """Between runs of a warm worker: no rows left over."""
        self.core = make_core(self.model, self.info.max_batch_size, self.info.kv_budget_bytes)
        self.origin_s = None

    def run_facts(self) -> dict:
        """Joiners held back for want of a free row (never, while the scheduler keeps to its credit)."""
        return {"rows_held_back": self.core.held_back}


class EchoBackend(SimBackend):
    """The harness-only backend: tokens come back at once (the zero-time `echo` preset, whatever the run's
    preset and step budget)."""

    def __init__(self, _preset: str = "echo", mode: str = BatchingMode.STATIC, max_batch_size: int = 1024,
                 **_unused) -> None:
        super().__init__("echo", mode=mode, max_batch_size=max_batch_size, backend="echo")
