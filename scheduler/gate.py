"""Who may submit requests to the scheduler, and which: the traffic that announced its schedule (the
first TrafficHello), and of its requests only the ids its schedule holds (0 .. n_requests - 1).

On loopback without keys any local process can connect to the scheduler's socket; its messages are
refused here, so a forged request never becomes a row nor takes a real request's id. Pure: senders
are the ROUTER's identities, no socket and no clock.
"""
from dataclasses import dataclass, field

from batchlab.protocol import EndOfStream, RequestMsg, TrafficHello

REFUSED_REQUESTS = "refused_requests"  # RequestMsgs not taken (the scheduler's stats, summary.json)
REFUSED_STREAM = "refused_stream_messages"  # a TrafficHello or EndOfStream from a second sender


@dataclass(slots=True)
class TrafficGate:
    """The announced traffic, and the checks of what claims to be it."""

    traffic: bytes | None = None  # identity of the sender of the first TrafficHello
    n_requests: int = 0  # its schedule's size
    received: int = 0  # requests let through
    stats: dict[str, int] = field(default_factory=lambda: {REFUSED_REQUESTS: 0, REFUSED_STREAM: 0})

    def refusal(self, sender: bytes, msg: object) -> str:
        """Why `msg` from `sender` is refused ("" when it is let through); a refusal is counted."""
        why, counter = self._why(sender, msg)
        if why:
            self.stats[counter] += 1
        elif isinstance(msg, TrafficHello):
            self.traffic, self.n_requests = sender, msg.n_requests
        elif isinstance(msg, RequestMsg):
            self.received += 1
        return why

    def _why(self, sender: bytes, msg: object) -> tuple[str, str]:
        if isinstance(msg, RequestMsg):
            if self.traffic is None:
                return f"request {msg.request_id} before any traffic announced a schedule", REFUSED_REQUESTS
            if sender != self.traffic:
                return f"request {msg.request_id} from {_name(sender)}, not the traffic", REFUSED_REQUESTS
            if msg.request_id >= self.n_requests:
                return (f"request {msg.request_id} outside the announced schedule of {self.n_requests}",
                        REFUSED_REQUESTS)
        elif isinstance(msg, (TrafficHello, EndOfStream)) and self.traffic not in (None, sender):
            return f"{type(msg).__name__} from {_name(sender)}: a second traffic", REFUSED_STREAM
        elif isinstance(msg, EndOfStream) and self.traffic is None:
            return f"EndOfStream from {_name(sender)} before any TrafficHello", REFUSED_STREAM
        return "", ""


def _name(sender: bytes) -> str:
    return repr(sender.decode(errors="replace"))[:40]
