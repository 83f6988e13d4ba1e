"""What the RunStore knows of a request while it is in memory, and what is left of it once it is
gone: its id in EndedIds (a bit for the usual ids 0..n-1), so that a late event is recognised and
counted instead of starting a new request."""
from dataclasses import dataclass, field

from batchlab.protocol import Arrival
from batchlab.protocol.ids import IdSet as EndedIds  # noqa: F401  (the ids of requests that left memory)

NAN = float("nan")


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
