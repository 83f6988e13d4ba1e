"""Who may submit requests to the scheduler, and which: pure (senders are the ROUTER's identities; the time of
receipt and the traffic's Start are given), no socket and no clock.

The gate binds the run's traffic for the whole run: the sender of the first TrafficHello (announcing the
run's own schedule, when the scheduler knows it), once. A second hello, a request after the stream's end
(the traffic's EndOfStream, its death or its silence: a process that takes over its routing id after it
died is refused), a request before Start, one outside the announced schedule, planned before Start or not
yet due, or, with the schedule known, one whose lengths or planned time differ from its row: each is
refused and counted, so a forged request never becomes a row nor takes a real request's id.
"""
import dataclasses

import numpy as np

from batchlab.protocol import EndOfStream, RequestMsg, TrafficHello

REFUSED_REQUESTS = "refused_requests"  # RequestMsgs not taken (the scheduler's stats, summary.json)
REFUSED_STREAM = "refused_stream_messages"  # a TrafficHello or EndOfStream not taken (a second one, a forgery)
PLANNED_TIME_TOLERANCE_S = 1e-3  # a planned time as the traffic computes it (t0 + offset, over a clock offset)
EARLY_TOLERANCE_S = 0.5  # a request may reach us this long before its planned time (a remote sender's clock error)


@dataclasses.dataclass(slots=True)
class PlannedSchedule:
    """The run's schedule as saved before its roles started: what its traffic may send, by request id."""

    schedule_hash: str
    offsets_s: np.ndarray  # planned arrival offset of request i (s after t0)
    prompt_lens: np.ndarray
    output_lens: np.ndarray
    closed_loop: bool = False  # a client sends when free: only the lengths are planned, not the times

    @property
    def n_requests(self) -> int:
        """Requests the schedule holds (ids 0 .. n - 1)."""
        return len(self.offsets_s)


@dataclasses.dataclass(slots=True)
class TrafficGate:
    """The announced traffic, and the checks of what claims to be it."""

    planned: PlannedSchedule | None = None  # the run's schedule, when the scheduler was given it
    traffic: bytes | None = None  # identity of the sender of the first TrafficHello
    n_requests: int = 0  # its schedule's size
    t0: float | None = None  # planned time 0 (set at Start): no request comes before it
    ended: str = ""  # why the stream is over ("": it is not): nothing more is taken from the traffic
    received: int = 0  # requests let through
    stats: dict[str, int] = dataclasses.field(default_factory=lambda: {REFUSED_REQUESTS: 0, REFUSED_STREAM: 0})

    def refusal(self, sender: bytes, msg: object, t: float = 0.0) -> str:
        """Why `msg` from `sender`, received at `t`, is refused ("" when it is let through); a refusal is counted."""
        why, counter = self._why(sender, msg, t)
        if why:
            self.stats[counter] += 1
        elif isinstance(msg, TrafficHello):
            self.traffic, self.n_requests = sender, msg.n_requests
        elif isinstance(msg, RequestMsg):
            self.received += 1
        elif isinstance(msg, EndOfStream):
            self.end("the traffic's EndOfStream")
        return why

    def start(self, t0: float) -> None:
        """The traffic was told to start: its planned time 0 is `t0`."""
        self.t0 = t0

    def end(self, why: str) -> None:
        """The stream is over (the first reason stays): the traffic's identity submits nothing more."""
        self.ended = self.ended or why

    def _why(self, sender: bytes, msg: object, t: float) -> tuple[str, str]:
        if isinstance(msg, RequestMsg):
            return self._request_refusal(sender, msg, t), REFUSED_REQUESTS
        if isinstance(msg, TrafficHello):
            return self._hello_refusal(sender, msg), REFUSED_STREAM
        if isinstance(msg, EndOfStream):
            if self.traffic is None:
                return f"EndOfStream from {_name(sender)} before any TrafficHello", REFUSED_STREAM
            if sender != self.traffic:
                return f"EndOfStream from {_name(sender)}: a second traffic", REFUSED_STREAM
            if self.ended:
                return f"a second EndOfStream: the stream ended already ({self.ended})", REFUSED_STREAM
        return "", ""

    def _hello_refusal(self, sender: bytes, hello: TrafficHello) -> str:
        if self.traffic is not None:
            who = "the traffic again" if sender == self.traffic else f"{_name(sender)}: a second traffic"
            return f"TrafficHello from {who} (the run's traffic is bound at its first hello)"
        if self.planned is not None and (hello.schedule_hash, hello.n_requests) != (self.planned.schedule_hash,
                                                                                    self.planned.n_requests):
            return (f"TrafficHello from {_name(sender)} announces schedule {hello.schedule_hash[:12]} of "
                    f"{hello.n_requests} requests, not the run's ({self.planned.schedule_hash[:12]}, "
                    f"{self.planned.n_requests})")
        return ""

    def _request_refusal(self, sender: bytes, msg: RequestMsg, t: float) -> str:
        rid = msg.request_id
        if self.traffic is None:
            return f"request {rid} before any traffic announced a schedule"
        if sender != self.traffic:
            return f"request {rid} from {_name(sender)}, not the traffic"
        if self.ended:
            return f"request {rid} after the stream ended ({self.ended})"
        if self.t0 is None:
            return f"request {rid} before the traffic was told to start"
        if rid >= self.n_requests:
            return f"request {rid} outside the announced schedule of {self.n_requests}"
        if msg.arrival_time < self.t0 - PLANNED_TIME_TOLERANCE_S:
            return f"request {rid} planned {self.t0 - msg.arrival_time:.3f} s before the traffic's start"
        if msg.arrival_time > t + EARLY_TOLERANCE_S:
            return f"request {rid} received {msg.arrival_time - t:.3f} s before its planned time"
        return self._schedule_refusal(msg) if self.planned is not None else ""

    def _schedule_refusal(self, msg: RequestMsg) -> str:
        """A request checked against its row of the run's schedule: its lengths, and (open loop) its time."""
        p, rid = self.planned, msg.request_id
        if (msg.prompt_len, msg.output_len) != (int(p.prompt_lens[rid]), int(p.output_lens[rid])):
            return (f"request {rid} of {msg.prompt_len} + {msg.output_len} tokens, its schedule's row says "
                    f"{int(p.prompt_lens[rid])} + {int(p.output_lens[rid])}")
        planned = self.t0 + float(p.offsets_s[rid])
        if not p.closed_loop and abs(msg.arrival_time - planned) > PLANNED_TIME_TOLERANCE_S:
            return (f"request {rid} planned at {msg.arrival_time - self.t0:.3f} s, its schedule says "
                    f"{planned - self.t0:.3f} s")
        return ""


def _name(sender: bytes) -> str:
    return repr(sender.decode(errors="replace"))[:40]
