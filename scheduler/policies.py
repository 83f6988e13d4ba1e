"""Batching policies: pure classes. No sockets, no clock reads.

A policy is shown the queue (the RequestMsgs traffic sent, oldest first; it reads their ids, planned
arrival times and prompt and output lengths), the time it is given, and one worker's free capacity, and
answers with a Decision (below). It sees the first max(worker rows, its `lookahead`) queued requests. The
live scheduler and the discrete-event simulator drive the same classes through scheduler.core.
"""
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from batchlab.protocol import RequestMsg
from batchlab.protocol.modes import BatchingMode

OOM_CLEAN_BATCHES_TO_PROBE = 20  # clean batches after an OOM before the cap is probed up by one


@dataclass(slots=True)
class Capacity:
    """One worker's room right now."""

    free_slots: int  # rows that may start now (a busy static worker has 0)
    kv_free_bytes: int  # KV memory not yet promised to running requests
    kv_bytes_per_token: int
    idle: bool  # nothing runs on the worker: a request must then always be allowed to start


@dataclass(slots=True)
class Decision:
    """Launch queue[:n] (or, when `pick` is given, the requests at those positions of the queue shown, in
    that order) because of `reason`; fail the requests at the positions in `reject` with `reject_reason`;
    or, launching nothing, ask to be woken at `wake_at` (None: at the next event)."""

    n: int = 0
    reason: str = ""
    wake_at: float | None = None
    pick: tuple[int, ...] = ()
    reject: tuple[int, ...] = ()
    reject_reason: str = ""


class Policy:
    """What the scheduler and the simulator need from a strategy, and a base class for one of your own: set
    `name` (default: the class's name in lower case) and `mode`, write `decide`; `Params`, a dataclass of
    typed parameters, is optional (the policy is then built as Class(params), reachable as self.params).
    scheduler.strategies loads a strategy by name (or takes the class) and builds it; a class of the same shape
    that does not inherit from this one works too (the built-ins do)."""

    name: ClassVar[str] = ""
    mode: ClassVar[str] = BatchingMode.STATIC  # or CONTINUOUS (protocol.modes): batch at a time, or join at steps

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__.lower()

    def __init__(self, params: object = None) -> None:
        self.params = params

    def decide(self, queue: Sequence[RequestMsg], now: float, cap: Capacity, end_of_stream: bool) -> Decision:
        """Launch, reject, or ask to be woken (see Decision); the queue is oldest first."""
        raise NotImplementedError(f"{type(self).__name__}.decide")

    def on_batch_done(self, size: int, oom: bool) -> None:
        """A batch of `size` rows ended (`oom`: it did not fit and came back to the queue); nothing by default."""


def at_least(low: float, **params: float) -> None:
    """ValueError naming the first parameter below `low` (a strategy refusing its parameters)."""
    for name, value in params.items():
        if value < low:
            raise ValueError(f"{name} must be ≥ {low:g}, got {value:g}")


def fit_padded(queue: Sequence[RequestMsg], limit: int, cap: Capacity, max_new_tokens: int) -> int:
    """How many of queue[:limit] fit a padded static batch in the KV budget (the memory rule:
    stop before (len(batch)+1) × (P_max + max_new_tokens) × kv_bytes_per_token > budget); ≥ 1."""
    p_max = 0
    for k in range(min(limit, len(queue))):
        p_max = max(p_max, queue[k].prompt_len)
        if (k + 1) * (p_max + max_new_tokens) * cap.kv_bytes_per_token > cap.kv_free_bytes:
            return max(k, 1)
    return min(limit, len(queue))


@dataclass
class AdaptiveCap:
    """The OOM back-off every static strategy shares: halve on OOM (min 1), +1 after clean batches."""

    limit: int
    cap: int = 0
    clean_batches: int = 0

    def __post_init__(self) -> None:
        self.cap = self.cap or self.limit

    def update(self, size: int, oom: bool) -> None:
        """Feed one finished batch of `size` rows."""
        if oom:
            self.cap = max(1, min(self.cap, size) // 2)
            self.clean_batches = 0
            return
        self.clean_batches += 1
        if self.clean_batches >= OOM_CLEAN_BATCHES_TO_PROBE and self.cap < self.limit:
            self.cap += 1
            self.clean_batches = 0


@dataclass(slots=True)
class NaiveParams:
    """naive's parameters (each defaults to the run's setting of the same name)."""

    batch_size: int = 8  # launch exactly N; also the worker's rows

    def __post_init__(self) -> None:
        at_least(1, batch_size=self.batch_size)


@dataclass
class Naive:
    """Wait for exactly `batch_size` requests; at end of stream flush the rest as a smaller batch.

    After an OOM, "exactly N" becomes exactly the halved cap: otherwise the batch would fail forever.
    """

    batch_size: int
    name: ClassVar[str] = "naive"
    mode: ClassVar[str] = BatchingMode.STATIC
    Params: ClassVar[type] = NaiveParams

    @classmethod
    def from_params(cls, params: NaiveParams) -> "Naive":
        """The policy a run's parameters describe."""
        return cls(params.batch_size)

    def __post_init__(self) -> None:
        self.adaptive = AdaptiveCap(self.batch_size)

    @property
    def rows(self) -> int:
        """Naive's worker runs `batch_size` rows: --max-batch-size must not widen it."""
        return self.batch_size

    def decide(self, queue: Sequence[RequestMsg], now: float, cap: Capacity,
               end_of_stream: bool) -> Decision:
        if cap.free_slots <= 0 or not queue:
            return Decision()
        n = min(self.batch_size, self.adaptive.cap, cap.free_slots)
        if len(queue) >= n:
            return Decision(n, "size")
        if end_of_stream:
            return Decision(len(queue), "flush")
        return Decision()

    def on_batch_done(self, size: int, oom: bool) -> None:
        """Only OOM changes naive batching (see the class docstring)."""
        self.adaptive.update(size, oom)


@dataclass(slots=True)
class DynamicParams:
    """dynamic's parameters (each defaults to the run's setting of the same name)."""

    max_batch_size: int = 16  # size trigger; also the worker's rows
    max_wait_ms: float = 50.0  # age trigger
    max_new_tokens: int = 128  # output tokens a padded batch reserves KV for, per row

    def __post_init__(self) -> None:
        at_least(1, max_batch_size=self.max_batch_size, max_new_tokens=self.max_new_tokens)
        at_least(0, max_wait_ms=self.max_wait_ms)


@dataclass
class Dynamic:
    """Launch on size, age of the oldest request, or memory budget; the cap halves on OOM."""

    max_batch_size: int
    max_wait_s: float
    max_new_tokens: int
    name: ClassVar[str] = "dynamic"
    mode: ClassVar[str] = BatchingMode.STATIC
    Params: ClassVar[type] = DynamicParams

    @classmethod
    def from_params(cls, params: DynamicParams) -> "Dynamic":
        """The policy a run's parameters describe."""
        return cls(params.max_batch_size, params.max_wait_ms / 1000.0, params.max_new_tokens)

    def __post_init__(self) -> None:
        self.adaptive = AdaptiveCap(self.max_batch_size)

    @property
    def cap(self) -> int:
        """The adaptive cap on rows per batch."""
        return self.adaptive.cap

    def decide(self, queue: Sequence[RequestMsg], now: float, cap: Capacity,
               end_of_stream: bool) -> Decision:
        """Over `queue` taken in the order given (sjf and edf give theirs ranked): launch its first n (n ≤ the
        cap, the size and the worker's room) on memory, size, the oldest's age or the end of the stream, else
        ask to be woken when the oldest ages out."""
        if cap.free_slots <= 0 or not queue:
            return Decision()
        limit = min(self.cap, self.max_batch_size, cap.free_slots)
        n = fit_padded(queue, limit, cap, self.max_new_tokens)
        if n < min(limit, len(queue)):
            return Decision(n, "memory")
        if len(queue) >= limit:
            return Decision(n, "size")
        deadline = min(r.arrival_time for r in queue) + self.max_wait_s
        if now >= deadline:
            return Decision(n, "age")
        if end_of_stream:
            return Decision(n, "flush")
        return Decision(wake_at=deadline)

    def on_batch_done(self, size: int, oom: bool) -> None:
        """Halve the cap on OOM (min 1); after enough clean batches probe it up by one."""
        self.adaptive.update(size, oom)


@dataclass(slots=True)
class ContinuousParams:
    """continuous's parameters (each defaults to the run's setting of the same name)."""

    max_batch_size: int = 16  # rows running at once on a worker

    def __post_init__(self) -> None:
        at_least(1, max_batch_size=self.max_batch_size)


@dataclass
class Continuous:
    """Forward queued requests as soon as the worker has credit (slots and KV), oldest first."""

    max_batch_size: int
    name: ClassVar[str] = "continuous"
    mode: ClassVar[str] = BatchingMode.CONTINUOUS
    Params: ClassVar[type] = ContinuousParams

    @classmethod
    def from_params(cls, params: ContinuousParams) -> "Continuous":
        """The policy a run's parameters describe."""
        return cls(params.max_batch_size)

    def decide(self, queue: Sequence[RequestMsg], now: float, cap: Capacity,
               end_of_stream: bool) -> Decision:
        """As many of `queue`, in the order given, as the worker's rows and KV credit take (the first always
        fits an idle worker)."""
        n, kv = 0, cap.kv_free_bytes
        for req in queue[: max(0, min(cap.free_slots, self.max_batch_size))]:
            need = (req.prompt_len + req.output_len) * cap.kv_bytes_per_token
            if need > kv and not (cap.idle and n == 0):
                break
            n, kv = n + 1, kv - need
        return Decision(n, "credit") if n else Decision()

    def on_batch_done(self, size: int, oom: bool) -> None:
        """Credit comes back through the capacity the scheduler reports."""


BUILTINS: dict[str, type] = {"naive": Naive, "dynamic": Dynamic, "continuous": Continuous}


def make_policy(strategy: str, **params: object) -> Policy:
    """A built-in policy by name; `params` are fields of its Params (the rest keep their defaults)."""
    cls = BUILTINS[strategy]
    return cls.from_params(cls.Params(**params))
