"""What every role tells the collector: the records a run's tables are built from.

Messages as protocol.messages describes them; a sender may pack several into one Bundle frame.
"""
import math
from dataclasses import dataclass, field

from batchlab.protocol.wire import BatchId, Count, Kind, Length, RequestId, TokenBytes


@dataclass(slots=True)
class RequestMsg:
    """One request as traffic submits it, and as the scheduler holds it. `arrival_time` is the planned
    time (t0 + offset). Each field is a column of requests.parquet (collector.request.RequestOutcome) unless
    its metadata says `column: False`; a new field reaches that table by being declared here."""

    KIND = Kind.REQUEST
    request_id: RequestId
    arrival_time: float
    send_time: float
    prompt_len: Length
    output_len: Length
    prompt_tokens: TokenBytes = field(default=b"", metadata={"column": False})  # bulky: schedule.parquet has them

    def is_valid(self) -> bool:
        """The packed prompt holds exactly prompt_len tokens (none at all: an Arrival's copy, which the
        scheduler sends without them): a frame far larger than its stated prompt is refused."""
        return not self.prompt_tokens or len(self.prompt_tokens) == 4 * self.prompt_len


@dataclass(slots=True)
class FailedRow:
    """A failed request inside a BatchDone: why it ended."""

    request_id: RequestId
    reason: str


@dataclass(slots=True)
class Tokens:
    """One step's new tokens: `token_ids[i]` belongs to `request_ids[i]` in batch `batch_ids[i]` (a
    request may repeat when a step yields several of its tokens; a continuous step serves many batches).
    `time` is when the tokens were really available."""

    KIND = Kind.TOKENS
    step: Count
    time: float
    request_ids: list[RequestId] = field(default_factory=list)
    batch_ids: list[BatchId] = field(default_factory=list)
    token_ids: list[Count] = field(default_factory=list)

    def is_valid(self) -> bool:
        """One request id and one batch id per token."""
        return len(self.request_ids) == len(self.batch_ids) == len(self.token_ids)


@dataclass(slots=True)
class Step:
    """Continuous mode: the shape of one engine step (for the per-step batch timeline)."""

    KIND = Kind.STEP
    worker_id: str
    step: Count
    start_time: float
    end_time: float
    running: Count  # rows that got a token: the decoded ones, then the `joined` ones
    joined: Count  # rows whose (last) prefill chunk ran, so they got their first token
    finished: Count
    prefill_tokens: Count = 0  # prompt tokens prefilled, chunks of rows still prefilling included
    prefill_rows: Count = 0  # rows that ran a prompt chunk (0: not said, a worker before protocol 7)
    prefill_width: Count = 0  # the longest chunk, tokens: a padded forward computes prefill_rows × it
    prefill_pairs: Count = 0  # Σ (f + n)² − f² over its chunks (n tokens after f prefilled): packed attention


@dataclass(slots=True)
class Arrival:
    """Scheduler → collector: a request was received (this makes it 'submitted'); its prompt tokens are
    left out."""

    KIND = Kind.ARRIVAL
    request: RequestMsg
    recv_time: float


@dataclass(slots=True)
class BatchLaunch:
    """Scheduler → collector: a Dispatch was sent; request `request_ids[i]` runs in batch `batch_ids[i]`."""

    KIND = Kind.BATCH_LAUNCH
    worker_id: str
    scheduled_time: float
    reason: str
    request_ids: list[RequestId] = field(default_factory=list)
    batch_ids: list[BatchId] = field(default_factory=list)
    queue_len: Count = 0  # requests still queued after this launch

    def is_valid(self) -> bool:
        """One batch id per request."""
        return len(self.request_ids) == len(self.batch_ids)

    def requests_in(self, batch_id: int) -> list[int]:
        """The requests it launched in batch `batch_id`, in order."""
        return [rid for rid, bid in zip(self.request_ids, self.batch_ids) if bid == batch_id]


@dataclass(slots=True)
class RequestFailed:
    """A terminal failure decided outside a worker's batch (queue full, worker lost, ...)."""

    KIND = Kind.REQUEST_FAILED
    request_id: RequestId
    reason: str
    time: float


@dataclass(slots=True)
class RunInfo:
    """The run's settings and setup, written into every table and the summary."""

    KIND = Kind.RUN_INFO
    settings: dict = field(default_factory=dict)

    def is_valid(self) -> bool:
        """`t0`, when given, is a finite number: every table's times count from it."""
        t0 = self.settings.get("t0", 0.0)
        return type(t0) in (int, float) and math.isfinite(t0) and abs(t0) < 2**63


@dataclass(slots=True)
class RunEnd:
    """Scheduler → collector: no more scheduling; wait for each named worker's bye, then write."""

    KIND = Kind.RUN_END
    submitted: Count
    workers: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@dataclass(slots=True)
class WorkerBye:
    """Worker → collector: this worker's last message, with its memory facts."""

    KIND = Kind.WORKER_BYE
    worker_id: str
    peak_memory_bytes: Count
    memory_kind: str
    stats: dict = field(default_factory=dict)


@dataclass(slots=True)
class Bundle:
    """Several messages in one frame, in order (one zmq send and one unpack for a loop pass's records).

    On the wire `[PROTOCOL_VERSION, BUNDLE, [[kind, *fields], ...]]`; each inner message is validated as
    if it came alone, and one bad inner message rejects the whole frame. Bundles do not nest.
    """

    KIND = Kind.BUNDLE
    messages: list = field(default_factory=list)
