"""Messages for one peer kept and sent as one frame (a Bundle when several, protocol.codec.encode_many):
the scheduler's and each worker's records for the collector. Times travel inside the messages, so holding
them a few milliseconds costs no accuracy and spares the peer a wake-up per message."""
import logging

from batchlab.protocol.clock import now
from batchlab.protocol.codec import split_frames

log = logging.getLogger("batchlab.protocol")

MAX_RECORDS_PER_FRAME = 4096  # a frame goes early once this many are kept


class Bundler:
    """Kept messages, in order; `flush()` sends them when due (`interval_s` after the first was kept),
    many, or forced."""

    def __init__(self, sock, interval_s: float, max_records: int = MAX_RECORDS_PER_FRAME) -> None:
        self.sock, self.interval_s, self.max_records = sock, interval_s, max_records
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
            send_split(self.sock, self.records)
            self.records, self.due = [], None


def send_split(sock, msgs: list) -> None:
    """`msgs` in order, in frames within the frame limit; a message too large alone is logged, not sent."""
    frames, left_out = split_frames(msgs)
    for frame in frames:
        sock.send(frame)
    for reason in left_out:
        log.error("not sent: %s", reason)
