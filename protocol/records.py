"""What every role tells the collector: the records a run's tables are built from.

Messages as protocol.messages describes them; a sender may pack several into one Bundle frame.
"""
from dataclasses import dataclass, field

from batchlab.protocol.wire import Kind


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


@dataclass(slots=True)
class Bundle:
    """Several messages in one frame, in order (one zmq send and one unpack for a loop pass's records).

    On the wire `[PROTOCOL_VERSION, BUNDLE, [[kind, *fields], ...]]`; each inner message is validated as
    if it came alone, and one bad inner message rejects the whole frame. Bundles do not nest.
    """

    KIND = Kind.BUNDLE
    messages: list = field(default_factory=list)
