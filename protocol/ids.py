"""A compact set of request ids (traffic numbers them 0..n-1): the collector's ids of requests that
left memory, the scheduler's ids already received."""

BITMAP_IDS = 1 << 26  # ids 0..BITMAP_IDS-1 take a bit each (8 MiB at most); others a set entry


class IdSet:
    """A set of request ids: a bit each for the usual ids 0..n-1, a set entry for others."""

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
