"""In-flight tokens: one attempt's tokens as two typed arrays (16 bytes a token, no Python object per
token), held by the RunStore until the request's rows go to a part file."""
from array import array
from collections.abc import Sequence


class TokenBuffer(Sequence):
    """One attempt's tokens in arrival order, as [(time, token_id), ...] over two typed arrays."""

    __slots__ = ("times", "ids")

    def __init__(self) -> None:
        self.times = array("d")  # scheduler-clock s
        self.ids = array("q")

    def append(self, time: float, token_id: int) -> None:
        self.times.append(time)
        self.ids.append(token_id)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(zip(self.times[index], self.ids[index]))
        return self.times[index], self.ids[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Sequence)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # mutable
