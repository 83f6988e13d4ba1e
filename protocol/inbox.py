"""Every role's receiving edge: frames in, each decoded and validated, a bad one counted (the role's
`rejected_messages`) and logged at most once per REJECT_LOG_INTERVAL_S, and when each sender was last heard."""
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from batchlab.protocol.clock import now
from batchlab.protocol.codec import ProtocolError, decode_all
from batchlab.protocol.messages import CollectorAck, Heartbeat
from batchlab.protocol.sockets import recv_frames

REJECTED = "rejected_messages"  # the counter's name in every role's stats and in summary.json
REJECT_LOG_INTERVAL_S = 5.0  # at most one log line about rejections per interval, never one per frame
MAX_FRAMES_PER_POLL = 10_000  # then the role's loop runs its other steps before reading on
ACK_POLL_MS = 50  # while waiting for the collector's ack, look for a stop this often


@dataclass(slots=True)
class RateLimitedLog:
    """A warning at most once per `interval_s`, saying how many came since the last line."""

    log: logging.Logger
    interval_s: float = REJECT_LOG_INTERVAL_S
    last_s: float = -math.inf  # the first one is logged at once
    since: int = 0

    def warn(self, what: str, detail: object) -> None:
        """Note one; log it (with the count since the last line) when the interval has passed."""
        self.since += 1
        t = now()
        if t - self.last_s >= self.interval_s:
            self.log.warning("%s: %d since the last such line; the last: %s", what, self.since, detail)
            self.last_s, self.since = t, 0


class Inbox:
    """One socket's messages. `peer`: the one sender a DEALER or PULL hears (None: a ROUTER's [identity,
    message] frames; a Heartbeat speaks for its `sender`, who beats from a socket of its own)."""

    def __init__(self, sock: zmq.Socket, log: logging.Logger, *, peer: str | None = None,
                 counters: dict | None = None, max_frames: int = MAX_FRAMES_PER_POLL) -> None:
        self.sock, self.peer, self.max_frames = sock, peer, max_frames
        self.counters = counters if counters is not None else {}  # the role's stats: REJECTED counts here
        self.counters.setdefault(REJECTED, 0)
        self.rejects = RateLimitedLog(log)
        self.heard: dict[str, float] = {}  # sender -> now() of its last valid message
        self.last_frame_s = now()  # of the last frame, valid or not

    def receive(self, timeout_ms: int = 0) -> list[tuple[bytes, object]]:
        """(sender, message) for every frame queued, in order, waiting up to timeout_ms for the first."""
        return self.drain() if self.sock.poll(timeout_ms) else []

    def drain(self) -> list[tuple[bytes, object]]:
        """(sender, message) for the frames already queued (at most max_frames), without waiting."""
        out: list[tuple[bytes, object]] = []
        for _ in range(self.max_frames):
            try:
                frames = recv_frames(self.sock) if self.peer is None else [self.sock.recv(zmq.NOBLOCK)]
            except zmq.Again:
                break
            self.last_frame_s = now()
            out += self._decode(frames)
        return out

    def reject(self, why: object) -> None:
        """Count one bad message (also one that decodes but cannot be used) and log it, throttled."""
        self.counters[REJECTED] += 1
        self.rejects.warn("rejected messages", why)

    def silent_s(self, sender: str, t: float) -> float:
        """How long `sender` has been silent at t (0 when it was never heard)."""
        return t - self.heard.get(sender, t)

    def _decode(self, frames: list[bytes]) -> list[tuple[bytes, object]]:
        try:
            if self.peer is None and len(frames) != 2:
                raise ProtocolError(f"expected [identity, message], got {len(frames)} frames")
            msgs = decode_all(frames[-1])  # a Bundle: a worker's step or a scheduler pass, in order
        except ProtocolError as exc:
            self.reject(exc)
            return []
        sender = frames[0] if self.peer is None else self.peer.encode()
        for msg in msgs:
            name = self.peer or (msg.sender if isinstance(msg, Heartbeat) else sender.decode(errors="replace"))
            self.heard[name] = self.last_frame_s
        return [(sender, msg) for msg in msgs]


def wait_for_ack(inbox: Inbox, taken: str, wait_s: float, interrupted: Callable[[], bool]) -> bool:
    """Read `inbox` (a socket to the collector) until its CollectorAck of `taken` (RunEnd, WorkerBye) came:
    True; False once `wait_s` passed or `interrupted()` (a stop signal: the run is being stopped)."""
    deadline = now() + wait_s
    while not interrupted():
        for _, msg in inbox.receive(ACK_POLL_MS):
            if isinstance(msg, CollectorAck) and msg.taken == taken:
                return True
        if now() >= deadline:
            return False
    return False
