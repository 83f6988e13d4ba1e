"""The wire's vocabulary: the protocol version, one kind number per message, packed token rows.

The messages themselves are declared in protocol.messages (control) and protocol.records (to the collector).
"""
from enum import IntEnum

import numpy as np

PROTOCOL_VERSION = 2  # 2: Dispatch carries several batches (`sizes`); Bundle
STEP_BATCH = -1  # Tokens.batch_id of a continuous step: each token belongs to its request's latest batch


class TokenBytes(bytes):
    """Token ids packed as little-endian uint32 (`pack_tokens`): the scheduler forwards them unread."""


class RequestRow(list):
    """A request inside a Dispatch: [request_id, prompt_len, output_len, TokenBytes]."""


class FailedRow(list):
    """A failed request inside a BatchDone: [request_id, reason]."""


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
