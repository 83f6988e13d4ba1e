"""What the RunStore knows of a request while it is in memory, and what is left of it once it is
gone: its id in EndedIds (a bit for the usual ids 0..n-1), so that a late event is recognised and
counted instead of starting a new request."""
from dataclasses import dataclass, field

from batchlab.protocol import Arrival

NAN = float("nan")
BITMAP_IDS = 1 << 26  # ids 0..BITMAP_IDS-1 take a bit each (8 MiB at most); others a set entry


@dataclass(slots=True)
class RequestState:
    """What is known about one request so far."""

    request_id: int
    arrival: Arrival | None = None
    batches: list[int] = field(default_factory=list)  # batch ids it was launched in, in order
    status: str = ""  # "" until terminal, then "finished" | "failed"
    error: str = ""
    terminal_batch: int | None = None  # the batch whose BatchDone made it terminal
    # once its token rows went to a part: the counting batch and its tokens' count, first and last
    # time (scheduler clock); the rows themselves are no longer in memory
    taken_batch: int | None = None
    taken: tuple[int, float, float] = (0, NAN, NAN)
    taken_at: int = 0  # the take (RunStore.take_parts call) that last wrote its request row


class EndedIds:
    """The ids of requests whose state left memory."""

    __slots__ = ("_bits", "_others")

    def __init__(self) -> None:
        self._bits = bytearray()
        self._others: set[int] = set()

    def add(self, request_id: int) -> None:
        if 0 <= request_id < BITMAP_IDS:
            byte = request_id >> 3
            if byte >= len(self._bits):  # grow by doubling: amortised O(1)
                self._bits.extend(bytes(max(byte + 1, 2 * len(self._bits)) - len(self._bits)))
            self._bits[byte] |= 1 << (request_id & 7)
        else:
            self._others.add(request_id)

    def __contains__(self, request_id: object) -> bool:
        if type(request_id) is not int:
            return False
        if 0 <= request_id < BITMAP_IDS:
            byte = request_id >> 3
            return byte < len(self._bits) and bool(self._bits[byte] >> (request_id & 7) & 1)
        return request_id in self._others
