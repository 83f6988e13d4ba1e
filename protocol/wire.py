"""The wire's vocabulary: the protocol version, one kind number per message, packed token ids.

The messages themselves are declared in protocol.messages (control) and protocol.records (to the collector).
"""
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated

import numpy as np

PROTOCOL_VERSION = 7  # 3: RequestsEnded (closed loop). 4: typed rows; a batch id per row and per token.
# 5: EndOfStreamAck (traffic keeps its socket until the scheduler took the stream); a RequestMsg's
# tokens match its prompt_len. 6: the collector is a ROUTER that answers: CollectorAck (the scheduler and
# the workers keep their sockets until it took their last record), a Heartbeat back to the scheduler's
# heartbeat. 7: a Step says its prompt chunks' shape: rows, the longest, token pairs (what the forward computed).


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # every int on the wire fits a table's int64 column


@dataclass(frozen=True, slots=True)
class AtLeast:
    """An int field's smallest legal value: the codec refuses a smaller one."""

    minimum: int


# Every int on the wire lies within int64 and every float is finite; these add a lower bound.
RequestId = Annotated[int, AtLeast(0)]  # traffic numbers requests from 0
BatchId = Annotated[int, AtLeast(0)]  # the scheduler numbers batches from 0
Count = Annotated[int, AtLeast(0)]  # rows, tokens, bytes, steps: never negative
Length = Annotated[int, AtLeast(1)]  # a prompt or an output has at least one token


class TokenBytes(bytes):
    """Token ids packed as little-endian uint32 (`pack_tokens`): the scheduler forwards them unread."""


def pack_tokens(ids) -> bytes:
    """Token ids → TokenBytes wire form."""
    return np.asarray(ids, dtype="<u4").tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    """TokenBytes wire form → token ids."""
    return np.frombuffer(data, dtype="<u4").tolist()


class Kind(IntEnum):
    """One small integer per message type (the second array element)."""

    TRAFFIC_HELLO = 1
    START = 2
    REQUEST = 3
    END_OF_STREAM = 4
    WORKER_HELLO = 5
    DISPATCH = 6
    TOKENS = 7
    BATCH_DONE = 8
    HEARTBEAT = 9
    SHUTDOWN = 10
    ARRIVAL = 11
    BATCH_LAUNCH = 12
    REQUEST_FAILED = 13
    RUN_INFO = 14
    RUN_END = 15
    WORKER_BYE = 16
    STEP = 17
    CLOCK_PING = 18
    CLOCK_PONG = 19
    WORKER_CAPACITY = 20
    BUNDLE = 21
    REQUESTS_ENDED = 22
    END_OF_STREAM_ACK = 23
    COLLECTOR_ACK = 24
