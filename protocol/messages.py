"""Every message batchlab sends, declared once, and the wire's vocabulary: the protocol version, one kind
number per message, packed token ids. The control messages come first, then what every role tells the
collector.

On the wire a message is a MessagePack array `[PROTOCOL_VERSION, kind, *fields]`, fields in the order
declared here; a nested row (RequestRow, FailedRow, a RequestMsg inside one) is the array of its fields.
One request along its hops: RequestMsg (traffic → scheduler, which holds it as sent) → RequestRow (the
scheduler → a worker: the RequestMsg and the batch it runs in) → worker.backend.Row (what a backend runs).
All times are seconds on the scheduler host's monotonic clock (see protocol.clock).
"""
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Annotated

import numpy as np

__all__ = [
    "PROTOCOL_VERSION", "BatchId", "Count", "Length", "RequestId", "FailedRow", "Kind", "RequestRow",
    "TokenBytes", "pack_tokens", "unpack_tokens",
    "Arrival", "BatchLaunch", "Bundle", "RequestFailed", "RunEnd", "RunInfo", "Step", "Tokens", "WorkerBye",
    "TrafficHello", "Start", "RequestMsg", "EndOfStream", "EndOfStreamAck", "RequestsEnded", "WorkerHello", "Dispatch",
    "BatchDone", "Heartbeat", "Shutdown", "ClockPing", "ClockPong", "WorkerCapacity", "MESSAGE_TYPES",
]

PROTOCOL_VERSION = 5  # 3: RequestsEnded (closed loop). 4: typed rows; a batch id per row and per token.
# 5: EndOfStreamAck (traffic keeps its socket until the scheduler took the stream); a RequestMsg's
# tokens match its prompt_len


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # every int on the wire fits a table's int64 column


@dataclass(frozen=True, slots=True)
class AtLeast:
    """An int field's smallest legal value: the codec refuses a smaller one."""

    minimum: int


# Every int on the wire lies within int64 and every float is finite; these add a lower bound.
RequestId = Annotated[int, AtLeast(0)]  # traffic numbers requests from 0
BatchId = Annotated[int, AtLeast(0)]  # the scheduler numbers batches from 0
Count = Annotated[int, AtLeast(0)]  # rows, tokens, bytes, steps: never negative
Length = Annotated[int, AtLeast(1)]  # a prompt or an output has at least one token


class TokenBytes(bytes):
    """Token ids packed as little-endian uint32 (`pack_tokens`): the scheduler forwards them unread."""


def pack_tokens(ids) -> bytes:
    """Token ids → TokenBytes wire form."""
    return np.asarray(ids, dtype="<u4").tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    """TokenBytes wire form → token ids."""
    return np.frombuffer(data, dtype="<u4").tolist()


class Kind(IntEnum):
    """One small integer per message type (the second array element)."""

    TRAFFIC_HELLO = 1
    START = 2
    REQUEST = 3
    END_OF_STREAM = 4
    WORKER_HELLO = 5
    DISPATCH = 6
    TOKENS = 7
    BATCH_DONE = 8
    HEARTBEAT = 9
    SHUTDOWN = 10
    ARRIVAL = 11
    BATCH_LAUNCH = 12
    REQUEST_FAILED = 13
    RUN_INFO = 14
    RUN_END = 15
    WORKER_BYE = 16
    STEP = 17
    CLOCK_PING = 18
    CLOCK_PONG = 19
    WORKER_CAPACITY = 20
    BUNDLE = 21
    REQUESTS_ENDED = 22
    END_OF_STREAM_ACK = 23


def message(kind: Kind):
    """Declares a message: a slotted dataclass that travels as `kind` (its class attribute KIND)."""
    def declare(cls: type) -> type:
        cls.KIND = kind
        return dataclass(slots=True)(cls)
    return declare


# --- traffic <-> scheduler -------------------------------------------------------------------------
@message(Kind.TRAFFIC_HELLO)
class TrafficHello:
    """Traffic announces its schedule and asks when to start."""

    n_requests: Count
    schedule_hash: str
    duration_s: float
    concurrency: Count = 0  # closed loop's clients (0: open loop): the scheduler then sends it RequestsEnded


@message(Kind.START)
class Start:
    """Scheduler → traffic: workers are warm; planned time 0 of the schedule is `t0`."""

    t0: float


@message(Kind.REQUEST)
class RequestMsg:
    """One request as traffic submits it, and as the scheduler holds it. `arrival_time` is the planned
    time (t0 + offset)."""

    request_id: RequestId
    arrival_time: float
    send_time: float
    prompt_len: Length
    output_len: Length
    prompt_tokens: TokenBytes = b""

    def is_valid(self) -> bool:
        """The packed prompt holds exactly prompt_len tokens (none at all: an Arrival's copy, which the
        scheduler sends without them): a frame far larger than its stated prompt is refused."""
        return not self.prompt_tokens or len(self.prompt_tokens) == 4 * self.prompt_len


@message(Kind.END_OF_STREAM)
class EndOfStream:
    """Traffic has sent everything it will send (`sent` requests)."""

    sent: Count


@message(Kind.END_OF_STREAM_ACK)
class EndOfStreamAck:
    """Scheduler → traffic: its EndOfStream was taken, so was every frame sent before it (one pipe, in
    order; `received`: the requests it took from this traffic). Until then the traffic keeps its socket
    open: frames still queued in it when it closed would be lost (a scheduler stalled, or behind at a
    high rate)."""

    received: Count


@message(Kind.REQUESTS_ENDED)
class RequestsEnded:
    """Scheduler → a closed-loop traffic: these requests ended (finished or failed) by time `t`, so their
    clients may send again. Sent only to a traffic whose hello gave a concurrency."""

    request_ids: list[RequestId]
    t: float


# --- scheduler <-> worker --------------------------------------------------------------------------
@message(Kind.WORKER_HELLO)
class WorkerHello:
    """A warm worker joins: its capacity and model facts. Sent after warm-up (hello = ready)."""

    worker_id: str
    backend: str
    model: str
    mode: str  # "static": one batch at a time; "continuous": requests join at step boundaries
    max_batch_size: Length  # rows (sequences) the worker runs at once
    kv_bytes_per_token: Count
    kv_budget_bytes: Count
    device: str
    memory_kind: str  # what peak_memory_bytes measures, e.g. "cuda_max_allocated", "cpu_peak_rss"
    facts: dict = field(default_factory=dict)

    def as_run_info(self) -> dict:
        """This worker as RunInfo's `workers[worker_id]` records it: its facts, the hello's fields over them."""
        return {**self.facts, **{name: getattr(self, name) for name in self.__slots__
                                 if name not in ("worker_id", "facts")}}


@dataclass(slots=True)
class RequestRow:
    """A request inside a Dispatch (scheduler → worker): the RequestMsg traffic sent, and its batch."""

    batch_id: BatchId
    request: RequestMsg


@message(Kind.DISPATCH)
class Dispatch:
    """Scheduler → worker: one scheduling pass's requests for it, each row naming its batch (a static
    pass: one batch id for every row; a continuous one: a batch per request, which joins and leaves alone)."""

    scheduled_time: float
    reason: str
    requests: list[RequestRow] = field(default_factory=list)


@dataclass(slots=True)
class FailedRow:
    """A failed request inside a BatchDone: why it ended."""

    request_id: RequestId
    reason: str


@message(Kind.BATCH_DONE)
class BatchDone:
    """Worker → scheduler and collector: a dispatched batch is over.

    `finished` rows got exactly their output_len tokens; `failed` rows say why each other one ended;
    `oom` means the batch ran out of memory and every row may be retried (none is terminal).
    """

    batch_id: BatchId
    worker_id: str
    start_time: float
    end_time: float
    finished: list[RequestId] = field(default_factory=list)
    failed: list[FailedRow] = field(default_factory=list)
    oom: bool = False
    peak_memory_bytes: Count = 0
    engine_metrics: dict = field(default_factory=dict)  # {request_id (str): {name: value}} (vLLM's own stamps)


@message(Kind.HEARTBEAT)
class Heartbeat:
    """Liveness, both ways."""

    sender: str
    time: float


@message(Kind.SHUTDOWN)
class Shutdown:
    """Scheduler → worker/traffic: finish and exit."""

    reason: str


@message(Kind.CLOCK_PING)
class ClockPing:
    """Worker → scheduler: clock offset probe (worker's send time)."""

    seq: int
    t_send: float


@message(Kind.CLOCK_PONG)
class ClockPong:
    """Scheduler → worker: the probe echoed with the scheduler's clock reading."""

    seq: int
    t_send: float
    t_server: float


@message(Kind.WORKER_CAPACITY)
class WorkerCapacity:
    """Worker → scheduler: the rows it runs at once changed (an OOM halved them, clean steps probed them up).

    The scheduler uses `max_rows` instead of the hello's max_batch_size for this worker's credit, never
    above that announced maximum.
    """

    worker_id: str
    max_rows: Count
    reason: str


# --- to the collector: the records a run's tables are built from (several may share a Bundle frame) --
@message(Kind.TOKENS)
class Tokens:
    """One step's new tokens: `token_ids[i]` belongs to `request_ids[i]` in batch `batch_ids[i]` (a
    request may repeat when a step yields several of its tokens; a continuous step serves many batches).
    `time` is when the tokens were really available."""

    step: Count
    time: float
    request_ids: list[RequestId] = field(default_factory=list)
    batch_ids: list[BatchId] = field(default_factory=list)
    token_ids: list[Count] = field(default_factory=list)

    def is_valid(self) -> bool:
        """One request id and one batch id per token."""
        return len(self.request_ids) == len(self.batch_ids) == len(self.token_ids)


@message(Kind.STEP)
class Step:
    """Continuous mode: the shape of one engine step (for the per-step batch timeline)."""

    worker_id: str
    step: Count
    start_time: float
    end_time: float
    running: Count  # rows that got a token: the decoded ones, then the `joined` ones
    joined: Count  # rows whose (last) prefill chunk ran, so they got their first token
    finished: Count
    prefill_tokens: Count = 0  # prompt tokens prefilled, chunks of rows still prefilling included


@message(Kind.ARRIVAL)
class Arrival:
    """Scheduler → collector: a request was received (this makes it 'submitted'); its prompt tokens are
    left out."""

    request: RequestMsg
    recv_time: float


@message(Kind.BATCH_LAUNCH)
class BatchLaunch:
    """Scheduler → collector: a Dispatch was sent; request `request_ids[i]` runs in batch `batch_ids[i]`."""

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


@message(Kind.REQUEST_FAILED)
class RequestFailed:
    """A terminal failure decided outside a worker's batch (queue full, worker lost, ...)."""

    request_id: RequestId
    reason: str
    time: float


@message(Kind.RUN_INFO)
class RunInfo:
    """The run's settings and setup, written into every table and the summary."""

    settings: dict = field(default_factory=dict)

    def is_valid(self) -> bool:
        """`t0`, when given, is a finite number: every table's times count from it."""
        t0 = self.settings.get("t0", 0.0)
        return type(t0) in (int, float) and math.isfinite(t0) and abs(t0) < 2**63


@message(Kind.RUN_END)
class RunEnd:
    """Scheduler → collector: no more scheduling; wait for each named worker's bye, then write."""

    submitted: Count
    workers: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@message(Kind.WORKER_BYE)
class WorkerBye:
    """Worker → collector: this worker's last message, with its memory facts."""

    worker_id: str
    peak_memory_bytes: Count
    memory_kind: str
    stats: dict = field(default_factory=dict)


@message(Kind.BUNDLE)
class Bundle:
    """Several messages in one frame, in order (one zmq send and one unpack for a loop pass's records).

    On the wire `[PROTOCOL_VERSION, BUNDLE, [[kind, *fields], ...]]`; each inner message is validated as
    if it came alone, and one bad inner message rejects the whole frame. Bundles do not nest.
    """

    messages: list = field(default_factory=list)



MESSAGE_TYPES: tuple[type, ...] = (
    TrafficHello, Start, RequestMsg, EndOfStream, EndOfStreamAck, RequestsEnded, WorkerHello, Dispatch, BatchDone,
    Heartbeat, Shutdown, ClockPing, ClockPong, WorkerCapacity, Tokens, Step, Arrival, BatchLaunch, RequestFailed,
    RunInfo, RunEnd, WorkerBye, Bundle,
)
