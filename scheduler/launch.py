"""What a scheduling pass of the core (scheduler/core.py) decides: one launch per worker it gave work,
and when to ask it again. Pure data; the live process sends them (as frames within the limit a peer
accepts: it drops the connection of a sender that passes it), the simulator plays them."""
from dataclasses import dataclass, field, replace

from batchlab.protocol import BatchLaunch, Dispatch, RequestMsg, RequestRow, encode
from batchlab.protocol.codec import MAX_MESSAGE_BYTES


@dataclass(slots=True)
class Launch:
    """One pass's requests for `worker_id`, each row naming its batch (static: one; continuous: one each)."""

    worker_id: str
    reason: str
    rows: list[RequestRow]
    queue_len: int  # requests still queued after this launch

    @property
    def requests(self) -> list[RequestMsg]:
        """The requests it runs, in order."""
        return [row.request for row in self.rows]

    def batch_ids(self) -> list[int]:
        """Its distinct batch ids, in order."""
        return list(dict.fromkeys(row.batch_id for row in self.rows))

    def halves(self) -> tuple["Launch", "Launch"] | None:
        """Two launches splitting its rows at the batch boundary nearest the middle (None: one batch,
        which is one decision and never split)."""
        ids = self.batch_ids()
        if len(ids) < 2:
            return None
        cut = next(i for i, row in enumerate(self.rows) if row.batch_id == ids[len(ids) // 2])
        return replace(self, rows=self.rows[:cut]), replace(self, rows=self.rows[cut:])

    def dispatch(self, t: float) -> Dispatch:
        """The message that sends it to the worker, scheduled at `t`."""
        return Dispatch(t, self.reason, self.rows)

    def frames(self, t: float, max_bytes: int = MAX_MESSAGE_BYTES
               ) -> tuple[list[tuple["Launch", bytes]], list[tuple["Launch", str]]]:
        """([(it or a part of it, its Dispatch frame)], [(part, why it cannot be sent)]): halved at batch
        boundaries until each frame fits; a batch whose message alone passes the limit is never split."""
        frame = encode(self.dispatch(t))
        if len(frame) <= max_bytes:
            return [(self, frame)], []
        parts = self.halves()
        if parts is None:
            return [], [(self, f"dispatch of {len(self.rows)} rows is {len(frame)} bytes, over the "
                               f"{max_bytes}-byte frame limit")]
        head, tail = (part.frames(t, max_bytes) for part in parts)
        return head[0] + tail[0], head[1] + tail[1]

    def record(self, t: float) -> BatchLaunch:
        """The collector's record of it, launched at `t`."""
        return BatchLaunch(self.worker_id, t, self.reason, [row.request.request_id for row in self.rows],
                           [row.batch_id for row in self.rows], self.queue_len)


@dataclass(slots=True)
class Decisions:
    """What one scheduling pass decided: launches to send now, and when to ask again (None: at the next event)."""

    launches: list[Launch] = field(default_factory=list)
    wake_at: float | None = None
