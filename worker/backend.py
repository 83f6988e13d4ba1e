"""What the worker process needs from a model backend (sim, echo, hf, vllm, openai, or a plugin)."""
from collections.abc import Callable
from dataclasses import dataclass, field

from batchlab.protocol import RequestMsg, RequestRow, WorkerHello
from batchlab.protocol.wire import unpack_tokens
from batchlab.protocol.errors import BackendError
from batchlab.protocol.modes import BatchingMode


class OutOfMemory(Exception):
    """A batch did not fit the device (torch.OutOfMemoryError, or --strict-memory on CPU)."""


@dataclass(slots=True)
class BackendRequest:
    """One request as a backend runs it (the last hop of a request): the RequestMsg a Dispatch carried, the
    batch it runs in, and its prompt's token ids unpacked. Token ids in, exactly `output_len` tokens out."""

    request: RequestMsg
    batch_id: int
    prompt_tokens: list[int]  # request.prompt_tokens unpacked

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def output_len(self) -> int:
        return self.request.output_len

    @classmethod
    def of(cls, row: RequestRow) -> "BackendRequest":
        """The row a Dispatch carried, its prompt tokens unpacked."""
        return cls(row.request, row.batch_id, unpack_tokens(row.request.prompt_tokens))

    @classmethod
    def new(cls, request_id: int, prompt_len: int, output_len: int, prompt_tokens: list[int],
            batch_id: int) -> "BackendRequest":
        """One no traffic sent (a warm-up, a calibration, a benchmark): planned and sent at time 0."""
        return cls(RequestMsg(request_id, 0.0, 0.0, prompt_len, output_len), batch_id, prompt_tokens)


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
    prefill_rows: int = 0  # rows that ran a prompt chunk in this step (continuous mode)
    prefill_width: int = 0  # the longest of those chunks, tokens (continuous mode)
    prefill_pairs: int = 0  # Σ (f + n)² − f² over those chunks (worker.hf.chunks.chunk_shape)
    times: list[float] | None = None  # per token, parallel to request_ids; None: every token at `time`


def lockstep_output(rows: list[BackendRequest], step: int, token_of: Callable[[int, BackendRequest], int], time: float,
                    start_time: float) -> StepOutput:
    """Step `step` of a lockstep (static) batch: the rows still generating, each with `token_of(i, rows[i])`, and
    those whose last token this is."""
    live = [(i, r) for i, r in enumerate(rows) if step < r.output_len]
    return StepOutput(time=time, start_time=start_time, request_ids=[r.request_id for _, r in live],
                      token_ids=[token_of(i, r) for i, r in live], running=len(live),
                      finished=[r.request_id for _, r in live if step == r.output_len - 1])


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


class Backend:
    """What the worker calls on a model backend: a backend sets `info` and overrides what it does; the
    defaults serve one that lacks a capability (callers never probe). Continuous mode: `admit`, then `step`
    while `has_work`; static mode: `run_batch` (by default admit + step, so a continuous backend runs
    static batches too). worker.factory finds it by name and builds it with `from_config`."""

    info: BackendInfo
    modes: tuple[str, ...] = tuple(BatchingMode)  # the worker modes it runs

    @classmethod
    def check(cls, cfg, mode: str) -> None:
        """The settings checks a backend can make without loading anything, run in the calling process before
        any process starts (runner.preflight): raise (ConfigError, ValueError, ...) to refuse `cfg`."""

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "Backend":
        """Build from a RunConfig, in `mode`, running at most `rows` rows."""
        return cls(cfg, mode, rows)

    def warmup(self) -> None:
        """Before the hello: load, compile, measure (nothing by default)."""

    def admit(self, rows: list[BackendRequest]) -> None:
        """Rows join at the next step boundary."""
        raise BackendError(f"{type(self).__name__} runs static batches only (it has no admit/step)")

    def step(self) -> StepOutput | None:
        """Advance one step; None when nothing produced output (idle or waiting on I/O)."""
        return None

    def has_work(self) -> bool:
        """True while an admitted row has not ended."""
        return False

    def run_batch(self, rows: list[BackendRequest], on_step: Callable[[StepOutput], None]) -> None:
        """Run one static batch to its end, calling on_step after every step (OutOfMemory if it does not
        fit). Default: admit every row and step until all ended; rows that failed raise BackendError
        at the end (the worker then fails the unfinished rows)."""
        self.admit(rows)
        failed: list[tuple[int, str]] = []
        while self.has_work():
            out = self.step()
            if out is not None:
                on_step(out)
                failed.extend(out.failed)
        if failed:
            raise BackendError("; ".join(f"request {rid}: {why}" for rid, why in failed[:3]))

    def abort_all(self) -> None:
        """Drop every admitted row (after a failed step: else the next step repeats it)."""

    def reset(self) -> None:
        """Between runs of a warm worker: nothing left over from the last run."""

    @property
    def max_rows(self) -> int:
        """The rows it runs at once now (the worker reports a change to the scheduler as WorkerCapacity)."""
        return self.info.max_batch_size

    @property
    def max_rows_reason(self) -> str:
        """Why max_rows last moved."""
        return ""

    def take_metrics(self, request_ids: list[int]) -> dict[int, dict]:
        """The engine's own stamps of these ended requests (`*_ts` on this host's clock), taken: {} by default."""
        return {}

    def run_facts(self) -> dict:
        """Figures about the run as a whole, for WorkerBye's stats."""
        return {}

    def peak_memory_bytes(self) -> int:
        """The most memory its rows used (0: none it can see)."""
        return 0

    def close(self) -> None:
        """Release what it holds."""
