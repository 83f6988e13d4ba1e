"""What a scheduling pass of the core (scheduler/core.py) decides: the batches it launched, and when to
ask it again. Pure data; the live process sends them, the simulator plays them."""
from dataclasses import dataclass, field

from batchlab.protocol import BatchLaunch, Dispatch
from batchlab.scheduler.policies import QueuedRequest


@dataclass(slots=True)
class Launch:
    """A batch the core started: `requests` run on `worker_id` as batch `batch_id`."""

    worker_id: str
    batch_id: int
    reason: str
    requests: list[QueuedRequest]
    queue_len: int  # requests still queued after this launch

    def dispatch(self, t: float) -> Dispatch:
        """The message that sends it to the worker, scheduled at `t`."""
        return Dispatch(self.batch_id, t, self.reason, [r.row() for r in self.requests])

    def record(self, t: float) -> BatchLaunch:
        """The collector's record of it, launched at `t`."""
        return BatchLaunch(self.batch_id, self.worker_id, t, self.reason, [r.request_id for r in self.requests],
                           self.queue_len)


@dataclass(slots=True)
class Decisions:
    """What one scheduling pass decided: batches to send now, and when to ask again (None: at the next event)."""

    launches: list[Launch] = field(default_factory=list)
    wake_at: float | None = None
