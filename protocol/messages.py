"""Every message batchlab sends, declared once.

On the wire a message is a MessagePack array `[PROTOCOL_VERSION, kind, *fields]`, fields in the order
declared here. All times are seconds on the scheduler host's monotonic clock (see protocol.clock).
"""
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

PROTOCOL_VERSION = 1
STEP_BATCH = -1  # Tokens.batch_id of a continuous step: each token belongs to its request's latest batch


class TokenBytes(bytes):
    """Token ids packed as little-endian uint32 (`pack_tokens`): the scheduler forwards them unread."""


class RequestRow(list):
    """A request inside a Dispatch: [request_id, prompt_len, output_len, TokenBytes]."""


class FailedRow(list):
    """A failed request inside a BatchDone: [request_id, reason]."""


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


# --- traffic <-> scheduler -------------------------------------------------------------------------
@dataclass(slots=True)
class TrafficHello:
    """Traffic announces its schedule and asks when to start."""

    KIND = Kind.TRAFFIC_HELLO
    n_requests: int
    schedule_hash: str
    duration_s: float


@dataclass(slots=True)
class Start:
    """Scheduler → traffic: workers are warm; planned time 0 of the schedule is `t0`."""

    KIND = Kind.START
    t0: float


@dataclass(slots=True)
class RequestMsg:
    """One request as traffic submits it. `arrival_time` is the planned time (t0 + offset)."""

    KIND = Kind.REQUEST
    request_id: int
    arrival_time: float
    send_time: float
    prompt_len: int
    output_len: int
    prompt_tokens: TokenBytes = b""


@dataclass(slots=True)
class EndOfStream:
    """Traffic has sent everything it will send (`sent` requests)."""

    KIND = Kind.END_OF_STREAM
    sent: int


# --- scheduler <-> worker --------------------------------------------------------------------------
@dataclass(slots=True)
class WorkerHello:
    """A warm worker joins: its capacity and model facts. Sent after warm-up (hello = ready)."""

    KIND = Kind.WORKER_HELLO
    worker_id: str
    backend: str
    model: str
    mode: str  # "static": one batch at a time; "continuous": requests join at step boundaries
    max_batch_size: int  # rows (sequences) the worker runs at once
    kv_bytes_per_token: int
    kv_budget_bytes: int
    device: str
    memory_kind: str  # what peak_memory_bytes measures, e.g. "cuda_max_allocated", "cpu_peak_rss"
    facts: dict = field(default_factory=dict)

    def as_run_info(self) -> dict:
        """This worker as RunInfo's `workers[worker_id]` records it: its facts, the hello's fields over them."""
        return {**self.facts, "backend": self.backend, "model": self.model, "mode": self.mode,
                "device": self.device, "max_batch_size": self.max_batch_size,
                "kv_budget_bytes": self.kv_budget_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "memory_kind": self.memory_kind}


@dataclass(slots=True)
class Dispatch:
    """Scheduler → worker: run these requests (RequestRow each)."""

    KIND = Kind.DISPATCH
    batch_id: int
    scheduled_time: float
    reason: str
    requests: list[RequestRow] = field(default_factory=list)


@dataclass(slots=True)
class BatchDone:
    """Worker → scheduler and collector: a dispatched batch is over.

    `finished` rows got exactly their output_len tokens; `failed` rows are [request_id, reason];
    `oom` means the batch ran out of memory and every row may be retried (none is terminal).
    """

    KIND = Kind.BATCH_DONE
    batch_id: int
    worker_id: str
    start_time: float
    end_time: float
    finished: list[int] = field(default_factory=list)
    failed: list[FailedRow] = field(default_factory=list)
    oom: bool = False
    peak_memory_bytes: int = 0
    engine_metrics: dict = field(default_factory=dict)  # {request_id (str): {name: value}} (vLLM's own stamps)


@dataclass(slots=True)
class Heartbeat:
    """Liveness, both ways."""

    KIND = Kind.HEARTBEAT
    sender: str
    time: float


@dataclass(slots=True)
class Shutdown:
    """Scheduler → worker/traffic: finish and exit."""

    KIND = Kind.SHUTDOWN
    reason: str


@dataclass(slots=True)
class ClockPing:
    """Worker → scheduler: clock offset probe (worker's send time)."""

    KIND = Kind.CLOCK_PING
    seq: int
    t_send: float


@dataclass(slots=True)
class ClockPong:
    """Scheduler → worker: the probe echoed with the scheduler's clock reading."""

    KIND = Kind.CLOCK_PONG
    seq: int
    t_send: float
    t_server: float


@dataclass(slots=True)
class WorkerCapacity:
    """Worker → scheduler: the rows it runs at once changed (an OOM halved them, clean steps probed them up).

    The scheduler uses `max_rows` instead of the hello's max_batch_size for this worker's credit, never
    above that announced maximum.
    """

    KIND = Kind.WORKER_CAPACITY
    worker_id: str
    max_rows: int
    reason: str


# --- everyone -> collector -------------------------------------------------------------------------
@dataclass(slots=True)
class Tokens:
    """One decode step's new tokens: `token_ids[i]` belongs to `request_ids[i]` (a request may repeat
    when a step yields several of its tokens). `time` is when the tokens were really available.
    In continuous mode one step serves many dispatches: batch_id is then STEP_BATCH."""

    KIND = Kind.TOKENS
    batch_id: int
    step: int
    time: float
    request_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Step:
    """Continuous mode: the shape of one engine step (for the per-step batch timeline)."""

    KIND = Kind.STEP
    worker_id: str
    step: int
    start_time: float
    end_time: float
    running: int  # rows that got a token: the decoded ones, then the `joined` ones
    joined: int  # rows whose (last) prefill chunk ran, so they got their first token
    finished: int
    prefill_tokens: int = 0  # prompt tokens prefilled, chunks of rows still prefilling included


@dataclass(slots=True)
class Arrival:
    """Scheduler → collector: a request was received (this makes it 'submitted')."""

    KIND = Kind.ARRIVAL
    request_id: int
    arrival_time: float
    send_time: float
    recv_time: float
    prompt_len: int
    output_len: int


@dataclass(slots=True)
class BatchLaunch:
    """Scheduler → collector: a batch was dispatched."""

    KIND = Kind.BATCH_LAUNCH
    batch_id: int
    worker_id: str
    scheduled_time: float
    reason: str
    request_ids: list[int] = field(default_factory=list)
    queue_len: int = 0  # requests still queued after this launch


@dataclass(slots=True)
class RequestFailed:
    """A terminal failure decided outside a worker's batch (queue full, worker lost, ...)."""

    KIND = Kind.REQUEST_FAILED
    request_id: int
    reason: str
    time: float


@dataclass(slots=True)
class RunInfo:
    """The run's settings and setup, written into every table and the summary."""

    KIND = Kind.RUN_INFO
    settings: dict = field(default_factory=dict)


@dataclass(slots=True)
class RunEnd:
    """Scheduler → collector: no more scheduling; wait for each named worker's bye, then write."""

    KIND = Kind.RUN_END
    submitted: int
    workers: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


@dataclass(slots=True)
class WorkerBye:
    """Worker → collector: this worker's last message, with its memory facts."""

    KIND = Kind.WORKER_BYE
    worker_id: str
    peak_memory_bytes: int
    memory_kind: str
    stats: dict = field(default_factory=dict)


MESSAGE_TYPES: tuple[type, ...] = (
    TrafficHello, Start, RequestMsg, EndOfStream, WorkerHello, Dispatch, BatchDone, Heartbeat,
    Shutdown, ClockPing, ClockPong, WorkerCapacity, Tokens, Step, Arrival, BatchLaunch, RequestFailed, RunInfo,
    RunEnd, WorkerBye,
)
