"""The scheduler's view of its workers: what each runs and its free capacity (liveness: the process's inbox)."""
from collections import deque
from dataclasses import dataclass, field

from batchlab.protocol import RequestMsg, WorkerHello
from batchlab.protocol.modes import BatchingMode
from batchlab.scheduler.policies import Capacity


@dataclass(slots=True)
class WorkerState:
    """One worker as the scheduler sees it (counters kept as batches come and go: no re-summing)."""

    hello: WorkerHello
    max_rows: int = 0  # rows it runs at once: the hello's max_batch_size until a WorkerCapacity moves it
    inflight: dict[int, list[RequestMsg]] = field(default_factory=dict)  # batch_id -> requests
    batches_done: int = 0
    running: int = 0  # requests in flight on this worker
    promised_tokens: int = 0  # Σ (prompt + output) of the requests in flight

    def __post_init__(self) -> None:
        self.max_rows = self.max_rows or self.hello.max_batch_size

    def set_max_rows(self, rows: int) -> int:
        """The worker's reported row cap, kept within [1, announced max]; returns the cap now used."""
        self.max_rows = max(1, min(rows, self.hello.max_batch_size))
        return self.max_rows

    def start(self, batch_id: int, group: list[RequestMsg]) -> None:
        """A batch was dispatched to this worker."""
        self.inflight[batch_id] = group
        self.running += len(group)
        self.promised_tokens += sum(p.prompt_len + p.output_len for p in group)

    def end(self, batch_id: int) -> list[RequestMsg] | None:
        """A batch is over; returns its requests (None if unknown)."""
        group = self.inflight.pop(batch_id, None)
        if group is not None:
            self.running -= len(group)
            self.promised_tokens -= sum(p.prompt_len + p.output_len for p in group)
        return group

    def capacity(self) -> Capacity:
        """Free room: a static worker takes one batch at a time; a continuous one fills its slots."""
        h = self.hello
        if h.mode != BatchingMode.CONTINUOUS:
            idle = not self.inflight
            return Capacity(self.max_rows if idle else 0, h.kv_budget_bytes, h.kv_bytes_per_token, idle)
        # below 0 when the cap fell under what runs: those rows finish, nothing new starts until then
        return Capacity(self.max_rows - self.running,
                        h.kv_budget_bytes - self.promised_tokens * h.kv_bytes_per_token,
                        h.kv_bytes_per_token, not self.inflight)


def least_loaded(workers: dict[str, WorkerState]) -> list[str]:
    """Worker ids, least loaded first (ties by name, so runs are reproducible)."""
    return sorted(workers, key=lambda w: (workers[w].running, w))


class PendingQueue(deque):
    """The scheduler's FIFO of requests (RequestMsg), counting the tokens (prompt + output) it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = 0

    def append(self, p: RequestMsg) -> None:
        """Join at the back."""
        super().append(p)
        self.tokens += p.prompt_len + p.output_len

    def appendleft(self, p: RequestMsg) -> None:
        """Go back to the front (requeue after an OOM or a lost worker)."""
        super().appendleft(p)
        self.tokens += p.prompt_len + p.output_len

    def take(self, requests: list[RequestMsg]) -> list[RequestMsg]:
        """Take these requests out wherever they wait (the others keep their order); returns those found."""
        wanted = {id(p) for p in requests}
        kept, taken = [p for p in self if id(p) not in wanted], [p for p in self if id(p) in wanted]
        self.clear()
        self.tokens = 0
        for p in kept:
            self.append(p)
        return taken

    def is_full_for(self, tokens: int, max_requests: int, max_tokens: int) -> bool:
        """Would one more request of `tokens` (prompt + output) break a bound? 0 means unbounded."""
        by_count = max_requests and len(self) >= max_requests
        by_tokens = max_tokens and self.tokens + tokens > max_tokens
        return bool(by_count or by_tokens)

    def popleft(self) -> RequestMsg:
        """Leave from the front."""
        p = super().popleft()
        self.tokens -= p.prompt_len + p.output_len
        return p
