"""ContinuousCore's timing rules (worker/sim.py) with O(1) bookkeeping per step, for virtual time.

`worker.sim.ContinuousCore.plan_step` walks every running row each step to build token lists. The
simulator needs only the step's duration and who joined or finished (a row admitted at step k yields
its i-th token at the end of step k + i), so this core keeps the same quantities as running sums:

    duration = decode_step_s(Σ_running (prompt_len + generated)) [if any row runs]
               + prefill_s(Σ_joiners prompt_len)

tests/test_simulator_core.py proves it step-for-step equal to ContinuousCore.
"""
from dataclasses import dataclass, field

from batchlab.worker.stepmodel import StepModel


@dataclass(slots=True)
class StepPlan:
    """One planned step: its duration, the rows that joined (prefilled) and that finished in it."""

    duration_s: float
    joined: list[int]  # request ids prefilled in this step (their token 0 ends it)
    finished: list[int]  # request ids whose last token ends this step
    running: int  # rows in the step, joiners included


@dataclass(slots=True)
class FastContinuousCore:
    """Rows join at the next step and leave after `output_len` steps; context tracked as a sum."""

    model: StepModel
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (request_id, prompt_len, output_len)
    n_running: int = 0
    context_tokens: int = 0  # Σ (prompt_len + generated) over running rows
    finishing: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # step -> [(rid, kv tokens)]
    step_no: int = 0

    def admit(self, request_id: int, prompt_len: int, output_len: int) -> None:
        """The row joins at the next step boundary."""
        self.pending.append((request_id, prompt_len, output_len))

    def has_work(self) -> bool:
        """True while any row waits or runs."""
        return bool(self.pending or self.n_running)

    def plan_step(self) -> StepPlan:
        """Advance one step (the same arithmetic as ContinuousCore.plan_step)."""
        joiners, self.pending = self.pending, []
        duration = self.model.decode_step_s(self.context_tokens) if self.n_running else 0.0
        duration += self.model.prefill_s(sum(p for _, p, _ in joiners))
        for rid, prompt_len, output_len in joiners:
            last = self.step_no + max(output_len, 1) - 1  # ContinuousCore always yields ≥ 1 token
            self.finishing.setdefault(last, []).append((rid, prompt_len + max(output_len, 1)))
            self.context_tokens += prompt_len
        self.n_running += len(joiners)
        running = self.n_running
        self.context_tokens += running  # every running row generated one token
        done = self.finishing.pop(self.step_no, [])
        self.n_running -= len(done)
        self.context_tokens -= sum(kv for _, kv in done)
        self.step_no += 1
        return StepPlan(duration, [rid for rid, _, _ in joiners], [rid for rid, _ in done], running)
