"""What the worker process needs from a model backend (sim, echo, hf, vllm, openai)."""
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from batchlab.protocol import WorkerHello


class OutOfMemory(Exception):
    """A batch did not fit the device (torch.OutOfMemoryError, or --strict-memory on CPU)."""


class BackendError(Exception):
    """A backend cannot start (bad model name, missing package, unreachable endpoint)."""


@dataclass(slots=True)
class Row:
    """One request as a worker runs it: token ids in, exactly `output_len` tokens out."""

    request_id: int
    prompt_len: int
    output_len: int
    prompt_tokens: list[int]
    batch_id: int


@dataclass(slots=True)
class StepOutput:
    """The result of one model step (static or continuous).

    `time` is when the step's tokens were really available on the host (after a CUDA sync); when
    `times` is set, `times[i]` is when `token_ids[i]` was, and `time` is the step's end.
    `token_ids[i]` belongs to `request_ids[i]`; a request may appear more than once.
    """

    time: float
    request_ids: list[int]
    token_ids: list[int]
    start_time: float = 0.0
    finished: list[int] = field(default_factory=list)  # reached their output_len at this step
    failed: list[tuple[int, str]] = field(default_factory=list)
    running: int = 0  # rows in the step (continuous mode)
    joined: int = 0  # rows that were prefilled in this step (continuous mode)
    prefill_tokens: int = 0  # prompt tokens prefilled in this step, chunks included (continuous mode)
    times: list[float] | None = None  # per token, parallel to request_ids; None: every token at `time`


@dataclass(slots=True)
class BackendInfo:
    """Facts a worker reports at hello."""

    backend: str
    model: str
    mode: str  # "static" or "continuous"
    max_batch_size: int
    kv_bytes_per_token: int
    kv_budget_bytes: int
    device: str = "cpu"
    memory_kind: str = "none"
    facts: dict = field(default_factory=dict)


def worker_hello(worker_id: str, info: BackendInfo, facts: dict | None = None) -> WorkerHello:
    """The hello a worker with this backend sends; `facts` (e.g. its clock offset) join the backend's."""
    return WorkerHello(worker_id, info.backend, info.model, info.mode, info.max_batch_size,
                       info.kv_bytes_per_token, info.kv_budget_bytes, info.device, info.memory_kind,
                       {**info.facts, **(facts or {})})


class StaticBackend(Protocol):
    """Runs one batch at a time in lockstep until its longest row is done (like generate())."""

    info: BackendInfo

    def warmup(self) -> None: ...

    def run_batch(self, rows: list[Row], on_step: Callable[[StepOutput], None]) -> None:
        """Run to completion, calling on_step after every step; raise OutOfMemory if it does not fit."""

    def peak_memory_bytes(self) -> int: ...

    def close(self) -> None: ...


class ContinuousBackend(Protocol):
    """Requests join the running set at step boundaries and leave when done."""

    info: BackendInfo

    def warmup(self) -> None: ...

    def admit(self, rows: list[Row]) -> None: ...

    def step(self) -> StepOutput | None:
        """Advance one step; None when nothing produced output (idle or waiting on I/O)."""

    def has_work(self) -> bool: ...

    def peak_memory_bytes(self) -> int: ...

    def close(self) -> None: ...


def run_to_completion(backend: "ContinuousBackend", rows: list[Row], on_step: Callable[[StepOutput], None]) -> None:
    """A static batch on a continuous backend: admit every row and step until all ended.

    Rows that failed raise BackendError at the end (the static worker loop then fails the unfinished rows).
    """
    backend.admit(rows)
    failed: list[tuple[int, str]] = []
    while backend.has_work():
        out = backend.step()
        if out is not None:
            on_step(out)
            failed.extend(out.failed)
    if failed:
        raise BackendError("; ".join(f"request {rid}: {why}" for rid, why in failed[:3]))
