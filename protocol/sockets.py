"""The one socket factory (bind or connect, options, CurveZMQ) and sending in bundles: messages for one peer
kept and sent as one frame (a Bundle when several, protocol.codec.encode_many), the scheduler's and each
worker's records for the collector. Times travel inside the messages, so holding them a few milliseconds
costs no accuracy and spares the peer a wake-up per message. The addresses, ports and routing ids are
protocol.addresses's."""
import logging
from collections.abc import Callable

import zmq

from batchlab.protocol.clock import now
from batchlab.protocol.codec import MAX_MESSAGE_BYTES, split_frames
from batchlab.protocol.errors import ConfigError
from batchlab.protocol.security import check_bind, secure_client, secure_server

SEND_HWM = 100_000  # messages queued per peer before a send blocks, or raises zmq.Again (NOBLOCK; a ROUTER's
# too, never a silent drop: every ROUTER here is ROUTER_MANDATORY)
RECV_HWM = 100_000
# The collector's link: frames of bundled records (tens of KiB each), queued this deep on each side at most, so a
# collector that falls behind (a loaded machine, a stall) slows its senders instead of holding their backlog in
# memory: a queue of 100,000 such frames grew the collector by gigabytes over a 60 s soak.
RECORDS_HWM = 1_000
RECORDS_SEND_TIMEOUT_MS = 500  # a send to a collector that reads nothing gives up this often to look at its stop
LINGER_MS = 2_000  # how long close() may flush unsent messages
HEARTBEAT_INTERVAL_S = 1.0
# A peer silent this long is declared dead. Long on purpose: a stall (a GC pause, swapping, a long compile,
# SIGSTOP) is not a death, and a peer that really ended is noticed at once by other means (its connection
# closes: the scheduler's sends to it fail; `batchlab run` sees the process end). RunConfig.liveness_s.
LIVENESS_S = 30.0
MAX_RECORDS_PER_FRAME = 4096  # a Bundler's frame goes early once this many are kept

log = logging.getLogger("batchlab.protocol")


def make_socket(ctx: zmq.Context, kind: int, address: str, *, bind: bool,
                identity: str | None = None, keys: str | None = None, hwm: int | None = None,
                send_timeout_ms: int = -1) -> zmq.Socket:
    """Create, configure and bind or connect one socket (`hwm`: its high-water marks, messages per peer, when
    not SEND_HWM and RECV_HWM; `send_timeout_ms`: a blocked send raises zmq.Again after it, -1: never).

    Binding anything but loopback requires `keys` (CurveZMQ); the binding process must also run
    `security.start_authenticator(ctx, keys)` so that only authorized clients get through.
    """
    if bind:
        check_bind(address, keys)
    sock = ctx.socket(kind)
    try:
        _configure(sock, kind, address, bind=bind, identity=identity, keys=keys, hwm=hwm)
        sock.setsockopt(zmq.SNDTIMEO, send_timeout_ms)
    except BaseException as exc:
        sock.close(linger=0)  # else the caller's ctx.term() waits forever for it (a port in use)
        if isinstance(exc, zmq.ZMQError):  # an address in use, or one that is no address: the user's
            raise ConfigError(f"cannot {'bind' if bind else 'connect to'} {address}: {exc}") from None
        raise
    return sock


def _configure(sock: zmq.Socket, kind: int, address: str, *, bind: bool, identity: str | None,
               keys: str | None, hwm: int | None) -> None:
    """Set the options, then bind or connect."""
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a peer sending more is disconnected unread
    sock.setsockopt(zmq.SNDHWM, hwm or SEND_HWM)
    sock.setsockopt(zmq.RCVHWM, hwm or RECV_HWM)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity.encode())
    if kind == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone peer raises, not drops
    if keys:
        (secure_server if bind else secure_client)(sock, keys)
    (sock.bind if bind else sock.connect)(address)


# Plain ints: pyzmq's flag enums cost an enum construction per `|` (send_multipart does one per frame).
_NOBLOCK, _SNDMORE, _RCVMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.RCVMORE)


def send_routed(sock: zmq.Socket, identity: bytes, frame: bytes, flags: int = 0) -> None:
    """[identity, frame] through a ROUTER (what send_multipart does, without its per-frame overhead)."""
    sock.send(identity, _SNDMORE | flags)
    sock.send(frame, flags)


def recv_frames(sock: zmq.Socket) -> list[bytes]:
    """Every frame of the next message, without waiting (zmq.Again when none is queued)."""
    frames = [sock.recv(_NOBLOCK)]
    while sock.getsockopt(_RCVMORE):
        frames.append(sock.recv(_NOBLOCK))
    return frames


class Bundler:
    """Kept messages, in order; `flush()` sends them when due (`interval_s` after the first was kept),
    many, or forced."""

    def __init__(self, sock, interval_s: float, max_records: int = MAX_RECORDS_PER_FRAME,
                 keep_trying: Callable[[], bool] | None = None) -> None:
        self.sock, self.interval_s, self.max_records = sock, interval_s, max_records
        self.keep_trying = keep_trying  # a send timed out (the peer reads nothing): try again? (send_split)
        self.send_s = 0.0  # time spent in sends: a peer behind (a full queue) makes its senders wait here
        self.records: list[object] = []
        self.due: float | None = None  # when the kept messages must go (None: none kept)

    def add(self, msg: object) -> None:
        self.records.append(msg)

    def extend(self, msgs: list) -> None:
        self.records += msgs

    def flush(self, force: bool = False) -> None:
        if not self.records:
            return
        t = now()
        if self.due is None:
            self.due = t + self.interval_s
        if force or t >= self.due or len(self.records) >= self.max_records:
            send_split(self.sock, self.records, self.keep_trying)
            self.records, self.due, self.send_s = [], None, self.send_s + now() - t


def send_split(sock, msgs: list, keep_trying: Callable[[], bool] | None = None) -> None:
    """`msgs` in order, in frames within the frame limit; a message too large alone is logged, not sent. On a
    socket with a send timeout, a frame the peer does not take in time (it is behind, or stalled) is tried
    again while `keep_trying()`; once it says no (the process is being stopped), the rest is logged, not sent."""
    frames, left_out = split_frames(msgs)
    for i, frame in enumerate(frames):
        if not _sent(sock, frame, keep_trying):
            log.error("not sent: %d frame(s) of %d messages: the peer took nothing and this process is stopping",
                      len(frames) - i, len(msgs))
            break
    for reason in left_out:
        log.error("not sent: %s", reason)


def _sent(sock, frame: bytes, keep_trying: Callable[[], bool] | None) -> bool:
    while True:
        try:
            sock.send(frame)
            return True
        except zmq.Again:  # the send timed out (send_timeout_ms): the queue to the peer is full
            if keep_trying is not None and not keep_trying():
                return False
