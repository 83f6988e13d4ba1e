"""Clock offset to the scheduler's host (workers and remote traffic), the way NTP/Cristian do it: keep
the minimum-RTT sample.

A worker on another host does not share the scheduler's monotonic clock. For a ping sent at local t1,
answered with the scheduler's reading ts, and received at local t2: rtt = t2 − t1, and the scheduler's
clock read ts somewhere in [t1, t2], so offset = ts − (t1 + t2)/2 with an error of at most rtt/2.
"""
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from batchlab.protocol import ClockPing, ClockPong, encode, now
from batchlab.protocol.inbox import Inbox

SYNC_SAMPLES = 8  # ping-pongs at hello
SYNC_TIMEOUT_S = 2.0  # per pong at hello
RESYNC_INTERVAL_S = 30.0  # one more ping this often while running
POLL_SLICE_MS = 100  # while waiting for a pong, look for a stop this often


@dataclass
class OffsetEstimate:
    """The best (minimum round-trip) samples of the last few."""

    window: deque = field(default_factory=lambda: deque(maxlen=2 * SYNC_SAMPLES))
    offset_s: float = 0.0
    uncertainty_s: float = float("inf")

    def add(self, t_send: float, t_server: float, t_recv: float) -> None:
        """Record one exchange and re-pick the minimum-RTT sample."""
        rtt = max(0.0, t_recv - t_send)
        self.window.append((rtt, t_server - (t_send + t_recv) / 2))
        rtt_min, self.offset_s = min(self.window)
        self.uncertainty_s = rtt_min / 2

    def to_scheduler(self, t_local: float) -> float:
        """A local timestamp on the scheduler's clock."""
        return t_local + self.offset_s

    def facts(self) -> dict:
        """For hello facts and the summary."""
        return {"clock_offset_s": self.offset_s, "clock_uncertainty_s": self.uncertainty_s,
                "clock_samples": len(self.window)}


def measure(inbox: Inbox, estimate: OffsetEstimate, samples: int = SYNC_SAMPLES,
            stopping: Callable[[], bool] = lambda: False) -> list[object]:
    """Ping-pong `samples` times through `inbox` (a DEALER to the scheduler); returns the other messages
    read meanwhile, in order. Gives up early when `stopping()` turns true (a signal during start-up)."""
    others: list[object] = []
    for seq in range(samples):
        if stopping():
            break
        inbox.sock.send(encode(ClockPing(seq, now())))
        deadline = now() + SYNC_TIMEOUT_S  # for this pong, looking at `stopping` every POLL_SLICE_MS
        while not stopping() and now() < deadline:
            msgs = [msg for _, msg in inbox.receive(POLL_SLICE_MS)]
            pong = next((m for m in msgs if isinstance(m, ClockPong) and m.seq == seq), None)
            others += [m for m in msgs if m is not pong]
            if pong is not None:
                estimate.add(pong.t_send, pong.t_server, now())
                break
    return others
