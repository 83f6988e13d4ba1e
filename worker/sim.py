"""The `sim` and `echo` backends: the step-time model played in real time (no model).

The timing rules live in pure functions (`static_step_durations`, `ContinuousCore.plan_step`) that the
discrete-event simulator reuses in virtual time.
"""
from collections.abc import Callable
from dataclasses import dataclass, field

from batchlab.protocol.clock import now, sleep_until
from batchlab.worker.backend import BackendInfo, Row, StepOutput
from batchlab.worker.stepmodel import StepModel, get_preset

FAKE_VOCAB = 32000


def fake_token(request_id: int, index: int) -> int:
    """A deterministic token id for row `request_id`'s `index`-th output token."""
    return (request_id * 7919 + index * 104729) % FAKE_VOCAB


def static_step_durations(rows: list[Row], model: StepModel) -> list[float]:
    """Durations of a padded lockstep batch: step 0 is the prefill (first token), then decode steps."""
    b, p_max = len(rows), max(r.prompt_len for r in rows)
    o_max = max(r.output_len for r in rows)
    durations = [model.prefill_s(b * p_max)]
    durations += [model.decode_step_s(b * (p_max + i)) for i in range(1, o_max)]
    return durations


@dataclass(slots=True)
class _Live:
    row: Row
    generated: int = 0


@dataclass
class ContinuousCore:
    """Iteration-level batching bookkeeping: joiners are prefilled in the next step, rows leave when done."""

    model: StepModel
    pending: list[Row] = field(default_factory=list)
    running: list[_Live] = field(default_factory=list)
    max_rows: int = 0  # the most rows in a step (the worker's announced cap); 0: no cap
    held_back: int = 0  # joiners that had to wait for a free row (a scheduler over its credit)

    def has_work(self) -> bool:
        """True while any row waits or runs."""
        return bool(self.pending or self.running)

    def plan_step(self) -> tuple[float, list[int], list[int], list[int], int, int]:
        """Advance one step: (duration_s, request_ids, token_indices, finished, running, joined)."""
        room = max(0, self.max_rows - len(self.running)) if self.max_rows else len(self.pending)
        joiners, self.pending = self.pending[:room], self.pending[room:]
        self.held_back += len(self.pending)
        context = sum(lv.row.prompt_len + lv.generated for lv in self.running)
        duration = self.model.decode_step_s(context) if self.running else 0.0
        duration += self.model.prefill_s(sum(r.prompt_len for r in joiners))
        self.running.extend(_Live(r) for r in joiners)
        ids, idx, finished, still = [], [], [], []
        for lv in self.running:
            ids.append(lv.row.request_id)
            idx.append(lv.generated)
            lv.generated += 1
            (finished if lv.generated >= lv.row.output_len else still).append(lv)
        self.running = still
        return duration, ids, idx, [lv.row.request_id for lv in finished], len(ids), len(joiners)


class SimBackend:
    """Sleeps for the modelled step times; static (lockstep batches) or continuous mode."""

    def __init__(self, preset: str = "a100-llama2-7b", mode: str = "static", max_batch_size: int = 64,
                 model_name: str | None = None, backend: str = "sim") -> None:
        self.model = get_preset(preset)
        self.core = ContinuousCore(self.model, max_rows=max_batch_size)
        self.info = BackendInfo(
            backend=backend, model=model_name or preset, mode=mode, max_batch_size=max_batch_size,
            kv_bytes_per_token=self.model.kv_bytes_per_token,
            kv_budget_bytes=self.model.kv_budget_bytes(), device="simulated", memory_kind="none",
            facts={"preset": self.model.as_dict()},
        )

    def warmup(self) -> None:
        """Nothing to warm."""

    def run_batch(self, rows: list[Row], on_step: Callable[[StepOutput], None]) -> None:
        """Play a lockstep batch: row r gets a token at steps 0 .. output_len-1."""
        t = now()
        for step, duration in enumerate(static_step_durations(rows, self.model)):
            start, t = t, t + duration
            sleep_until(t)
            live = [r for r in rows if step < r.output_len]
            on_step(StepOutput(
                time=now(), start_time=start, request_ids=[r.request_id for r in live],
                token_ids=[fake_token(r.request_id, step) for r in live],
                finished=[r.request_id for r in live if step == r.output_len - 1], running=len(live),
            ))

    def admit(self, rows: list[Row]) -> None:
        """Rows join at the next step boundary."""
        self.core.pending.extend(rows)

    def has_work(self) -> bool:
        """True while any admitted row is unfinished."""
        return self.core.has_work()

    def step(self) -> StepOutput | None:
        """One continuous step, played in real time."""
        if not self.core.has_work():
            return None
        start = now()
        duration, ids, idx, finished, running, joined = self.core.plan_step()
        sleep_until(start + duration)
        return StepOutput(time=now(), start_time=start, request_ids=ids,
                          token_ids=[fake_token(r, i) for r, i in zip(ids, idx)],
                          finished=finished, running=running, joined=joined)

    def abort_all(self) -> None:
        """Drop every admitted row (after a failed step): none is stepped again."""
        self.core.pending, self.core.running = [], []

    def reset(self) -> None:
        """Between runs of a warm worker: no rows left over."""
        self.core = ContinuousCore(self.model, max_rows=self.info.max_batch_size)

    def run_facts(self) -> dict:
        """Joiners held back for want of a free row (never, while the scheduler keeps to its credit)."""
        return {"rows_held_back": self.core.held_back}

    def peak_memory_bytes(self) -> int:
        """A simulator allocates nothing."""
        return 0

    def close(self) -> None:
        """Nothing to release."""


def make_echo(mode: str = "static", max_batch_size: int = 1024) -> SimBackend:
    """The harness-only backend: tokens come back at once."""
    return SimBackend("echo", mode=mode, max_batch_size=max_batch_size, backend="echo")
