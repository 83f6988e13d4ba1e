"""Every message batchlab sends, declared once: the control messages here, the collector's records in
protocol.records, kinds and the version in protocol.wire (all re-exported from this module).

On the wire a message is a MessagePack array `[PROTOCOL_VERSION, kind, *fields]`, fields in the order
declared here; a nested row (RequestRow, FailedRow, a RequestMsg inside one) is the array of its fields.
One request along its hops: RequestMsg (traffic → scheduler, which holds it as sent) → RequestRow (the
scheduler → a worker: the RequestMsg and the batch it runs in) → worker.backend.BackendRequest (what a backend
runs: the RequestMsg, its batch and its prompt unpacked).
All times are seconds on the scheduler host's monotonic clock (see protocol.clock).
"""
from dataclasses import dataclass, field

from batchlab.protocol.records import (Arrival, BatchLaunch, Bundle, RequestFailed, RunEnd, RunInfo, Step, Tokens,
                                       WorkerBye)
from batchlab.protocol.records import FailedRow, RequestMsg
from batchlab.protocol.wire import (PROTOCOL_VERSION, BatchId, Count, Kind, Length, RequestId, TokenBytes, pack_tokens,
                                    unpack_tokens)

__all__ = [
    "PROTOCOL_VERSION", "BatchId", "Count", "Length", "RequestId", "FailedRow", "Kind", "RequestRow",
    "TokenBytes", "pack_tokens", "unpack_tokens",
    "Arrival", "BatchLaunch", "Bundle", "RequestFailed", "RunEnd", "RunInfo", "Step", "Tokens", "WorkerBye",
    "TrafficHello", "Start", "RequestMsg", "EndOfStream", "EndOfStreamAck", "RequestsEnded", "WorkerHello", "Dispatch",
    "BatchDone", "Heartbeat",
    "Shutdown", "ClockPing", "ClockPong", "WorkerCapacity", "CollectorAck", "ACKED_RECORDS", "MESSAGE_TYPES",
]


# --- traffic <-> scheduler -------------------------------------------------------------------------
@dataclass(slots=True)
class TrafficHello:
    """Traffic announces its schedule and asks when to start."""

    KIND = Kind.TRAFFIC_HELLO
    n_requests: Count
    schedule_hash: str
    duration_s: float
    concurrency: Count = 0  # closed loop's clients (0: open loop): the scheduler then sends it RequestsEnded


@dataclass(slots=True)
class Start:
    """Scheduler → traffic: workers are warm; planned time 0 of the schedule is `t0`."""

    KIND = Kind.START
    t0: float


@dataclass(slots=True)
class EndOfStream:
    """Traffic has sent everything it will send (`sent` requests)."""

    KIND = Kind.END_OF_STREAM
    sent: Count


@dataclass(slots=True)
class EndOfStreamAck:
    """Scheduler → traffic: its EndOfStream was taken, so was every frame sent before it (one pipe, in
    order; `received`: the requests it took from this traffic). Until then the traffic keeps its socket
    open: frames still queued in it when it closed would be lost (a scheduler stalled, or behind at a
    high rate)."""

    KIND = Kind.END_OF_STREAM_ACK
    received: Count


@dataclass(slots=True)
class RequestsEnded:
    """Scheduler → a closed-loop traffic: these requests ended (finished or failed) by time `t`, so their
    clients may send again. Sent only to a traffic whose hello gave a concurrency."""

    KIND = Kind.REQUESTS_ENDED
    request_ids: list[RequestId]
    t: float


# --- scheduler <-> worker --------------------------------------------------------------------------
@dataclass(slots=True)
class WorkerHello:
    """A warm worker joins: its capacity and model facts. Sent after warm-up (hello = ready)."""

    KIND = Kind.WORKER_HELLO
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


@dataclass(slots=True)
class Dispatch:
    """Scheduler → worker: one scheduling pass's requests for it, each row naming its batch (a static
    pass: one batch id for every row; a continuous one: a batch per request, which joins and leaves alone)."""

    KIND = Kind.DISPATCH
    scheduled_time: float
    reason: str
    requests: list[RequestRow] = field(default_factory=list)


@dataclass(slots=True)
class BatchDone:
    """Worker → scheduler and collector: a dispatched batch is over.

    `finished` rows got exactly their output_len tokens; `failed` rows say why each other one ended;
    `oom` means the batch ran out of memory and every row may be retried (none is terminal).
    """

    KIND = Kind.BATCH_DONE
    batch_id: BatchId
    worker_id: str
    start_time: float
    end_time: float
    finished: list[RequestId] = field(default_factory=list)
    failed: list[FailedRow] = field(default_factory=list)
    oom: bool = False
    peak_memory_bytes: Count = 0
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
    max_rows: Count
    reason: str


# --- the collector -> a role ---------------------------------------------------------------------------
ACKED_RECORDS = ("RunEnd", "WorkerBye")  # the last record of the scheduler, of a worker


@dataclass(slots=True)
class CollectorAck:
    """Collector → the scheduler or a worker: its last record (`taken`: RunEnd or WorkerBye) was taken, so
    was every frame it sent before (one pipe, in order). Until then the role keeps its socket open, up to
    its liveness window: frames still queued in it when it closed would be lost (a collector stalled, or
    behind). The collector also answers the scheduler's Heartbeat with its own: the traffic starts only
    once it was heard."""

    KIND = Kind.COLLECTOR_ACK
    taken: str

    def is_valid(self) -> bool:
        """It names a role's last record."""
        return self.taken in ACKED_RECORDS


MESSAGE_TYPES: tuple[type, ...] = (
    TrafficHello, Start, RequestMsg, EndOfStream, EndOfStreamAck, RequestsEnded, WorkerHello, Dispatch, BatchDone,
    Heartbeat,
    Shutdown, ClockPing, ClockPong, WorkerCapacity, Tokens, Step, Arrival, BatchLaunch, RequestFailed, RunInfo,
    RunEnd, WorkerBye, Bundle, CollectorAck,
)
