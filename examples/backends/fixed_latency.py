"""A worker backend written outside batchlab, as a user would: every step takes the same time.

Each step gives every running row one made-up token and lasts STEP_S however many rows run: a model
whose step cost does not grow with the batch. It defines the continuous interface (admit, step,
has_work); static batches come from the base class's run_batch. Run it:

    PYTHONPATH=examples/backends batchlab run --backend fixed_latency:FixedLatency --dataset synthetic
    PYTHONPATH=examples/backends batchlab run --backend fixed_latency:FixedLatency --strategy continuous
"""
from batchlab.protocol.clock import now, sleep_until
from batchlab.worker.backend import Backend, BackendInfo, BackendRequest, StepOutput

VOCAB = 32000


class FixedLatency(Backend):
    """One token per running row every STEP_S; a row joins at the next step and leaves at its output length."""

    STEP_S = 0.01

    def __init__(self, mode: str = "continuous", max_batch_size: int = 64) -> None:
        self.info = BackendInfo(backend="fixed_latency", model="none", mode=mode, max_batch_size=max_batch_size,
                                kv_bytes_per_token=0, kv_budget_bytes=0, device="none", facts={"step_s": self.STEP_S})
        self.left: dict[int, int] = {}  # request_id -> tokens still to come
        self.joining = 0  # rows admitted since the last step
        self.steps = 0

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "FixedLatency":
        """Only the worker's mode and row cap matter here (cfg is the run's RunConfig)."""
        return cls(mode, rows)

    def admit(self, rows: list[BackendRequest]) -> None:
        """Rows join at the next step."""
        for r in rows:
            self.left[r.request_id] = r.output_len
        self.joining += len(rows)

    def has_work(self) -> bool:
        """True while an admitted row has tokens to come."""
        return bool(self.left)

    def step(self) -> StepOutput | None:
        """One token for every running row, STEP_S after the step began."""
        if not self.left:
            return None
        start, ids = now(), list(self.left)
        sleep_until(start + self.STEP_S)
        for rid in ids:
            self.left[rid] -= 1
        finished = [rid for rid in ids if not self.left[rid]]
        for rid in finished:
            del self.left[rid]
        joined, self.joining, self.steps = self.joining, 0, self.steps + 1
        return StepOutput(time=now(), start_time=start, request_ids=ids, token_ids=[rid % VOCAB for rid in ids],
                          finished=finished, running=len(ids), joined=joined)

    def abort_all(self) -> None:
        """Drop every row (after a failed step)."""
        self.left.clear()

    def reset(self) -> None:
        """Between runs of a warm worker."""
        self.left, self.joining, self.steps = {}, 0, 0

    def run_facts(self) -> dict:
        """Steps run, in the worker's bye."""
        return {"steps": self.steps}
