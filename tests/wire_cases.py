"""Wire fuzzing's material: one valid example of every message type, and for each of its fields values
that must be refused (wrong types, NaN, ±inf, 2**63, 2**64 - 1, -1 where the field is bounded), as raw
MessagePack frames (encode would not build some of them)."""
import dataclasses
import math
import typing

import msgpack
from hypothesis import strategies as st

from batchlab.protocol.messages import (PROTOCOL_VERSION, Arrival, BatchDone, BatchLaunch, ClockPing, ClockPong,
                                        CollectorAck, Dispatch, EndOfStream, EndOfStreamAck, FailedRow, Heartbeat,
                                        RequestFailed, RequestMsg, RequestRow, RunEnd, RunInfo, Shutdown, Start, Step,
                                        Tokens, TrafficHello, WorkerBye, WorkerCapacity, WorkerHello, pack_tokens)
from batchlab.protocol.wire import AtLeast, TokenBytes

NAN, INF = math.nan, math.inf
TOKENS = pack_tokens([1, 2, 3, 4])
VALID = [
    TrafficHello(3, "hash", 1.0), Start(1.0), RequestMsg(1, 1.0, 1.0, 4, 4, TOKENS), EndOfStream(3),
    EndOfStreamAck(3),
    WorkerHello("w0", "sim", "m", "static", 4, 1, 1000, "cpu", "none", {}),
    Dispatch(1.0, "credit", [RequestRow(0, RequestMsg(1, 1.0, 1.0, 4, 4, TOKENS))]),
    BatchDone(0, "w0", 1.0, 2.0, [1], [FailedRow(2, "x")], False, 0, {}),
    Heartbeat("scheduler", 1.0), Shutdown("over"), ClockPing(-1, 1.0), ClockPong(1, 1.0, 2.0),
    WorkerCapacity("w0", 2, "oom"), Tokens(0, 1.0, [1], [0], [5]), Step("w0", 0, 1.0, 2.0, 1, 1, 0, 0),
    Arrival(RequestMsg(1, 1.0, 1.0, 4, 4), 1.0), BatchLaunch("w0", 1.0, "credit", [1], [0], 0),
    RequestFailed(1, "x", 1.0),
    RunInfo({"t0": 1.0}), RunEnd(1, ["w0"], {}), WorkerBye("w0", 0, "none", {}), CollectorAck("RunEnd"),
]
BAD_INTS = [NAN, INF, 2**63, 2**64 - 1, "7", None, True, 1.5]  # wrong for every int field
BAD_FLOATS = [NAN, INF, -INF, 2**63, 2**64 - 1, "1.0", None, True]
REQUEST = [1, 1.0, 1.0, 4, 4, TOKENS]  # a RequestMsg's fields, as nested in a row
BAD_REQUESTS = [[-1, 1.0, 1.0, 4, 4, TOKENS], [1, 1.0, 1.0, 0, 4, TOKENS], [1, 1.0, 1.0, -100, 4, TOKENS],
                [1, 1.0, 1.0, 4, 0, TOKENS], [2**63, 1.0, 1.0, 4, 4, TOKENS], [1, 1.0, 1.0, 4, 4, b"abc"],
                [1, 1.0, 1.0, 4, NAN, TOKENS], [1, NAN, 1.0, 4, 4, TOKENS], [1, 1.0, 1.0, 4, 4], REQUEST[:2], None, "x",
                [1, 1.0, 1.0, 4, 4, pack_tokens([1, 2])],  # tokens ≠ prompt_len, as a top-level request's are checked
                [1, 1.0, 1.0, 1, 4, pack_tokens(range(1000))]]
BAD_ROWS = [[[0]], [[-1, REQUEST]], [[2**63, REQUEST]], [[0, REQUEST, 1]], [None],
            *[[[0, bad]] for bad in BAD_REQUESTS]]
BAD_SETTINGS = [{"t0": "abc"}, {"t0": NAN}, {"t0": INF}, {"t0": None}, {"t0": True}, {"t0": 2**64 - 1}]


def frame(msg: object, **replace: object) -> bytes:
    """`msg` as a raw frame, with some fields replaced (by name)."""
    values = [replace.get(name, getattr(msg, name)) for name in msg.__slots__]
    return msgpack.packb([PROTOCOL_VERSION, int(msg.KIND), *values], use_bin_type=True, default=_fields)


def _fields(row: object) -> list:
    """A nested row as the wire sends it: the array of its fields."""
    return [getattr(row, name) for name in row.__slots__]


def bad_values(cls: type, name: str) -> list:
    """Values field `name` of `cls` must refuse."""
    hint = typing.get_type_hints(cls, include_extras=True)[name]
    bound = [m.minimum for m in getattr(hint, "__metadata__", ()) if isinstance(m, AtLeast)]
    base = getattr(hint, "__origin__", hint) if bound else hint
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
    if cls is RunInfo:
        return BAD_SETTINGS + [None, [], "x"]
    if base is int:
        return BAD_INTS + [b - 1 for b in bound]
    if base is float:
        return BAD_FLOATS
    if hint is list[RequestRow]:
        return BAD_ROWS + [None, "x"]
    if hint is list[FailedRow]:
        return [[[-1, "x"]], [[2**64 - 1, "x"]], [[1, 2]], [[1]], [[NAN, "x"]], [[1, "x", 2]], None]
    if hint is RequestMsg:
        return BAD_REQUESTS
    if item is not None:
        kind = getattr(item, "__origin__", item)
        worst = [m.minimum - 1 for m in getattr(item, "__metadata__", ()) if isinstance(m, AtLeast)]
        return [None, "x", [None], [NAN], [2**64 - 1], *([[w] for w in worst] if kind is int else [[1]])]
    return {str: [None, 1, NAN, b"x"], bool: [None, 1, "true"], dict: [None, 1, "x", []],
            TokenBytes: [b"abc", "x", None]}[hint]


def _cases() -> list[tuple[object, str, object]]:
    out = []
    for msg in VALID:
        for f in dataclasses.fields(msg):
            out += [(msg, f.name, v) for v in bad_values(type(msg), f.name)]
    return out


BAD_CASES = _cases()  # (valid message, field, value that field must refuse)
bad_case = st.sampled_from(BAD_CASES)
bad_frame = bad_case.map(lambda c: frame(c[0], **{c[1]: c[2]}))


def launch(batch_id: int, worker_id: str, t: float, reason: str, request_ids: list[int], queue_len: int = 0
           ) -> BatchLaunch:
    """The BatchLaunch of a Dispatch that held one batch."""
    return BatchLaunch(worker_id, t, reason, request_ids, [batch_id] * len(request_ids), queue_len)


def tokens(batch_id: int, step: int, t: float, request_ids: list[int], token_ids: list[int]) -> Tokens:
    """A Tokens record whose every token belongs to batch `batch_id`."""
    return Tokens(step, t, request_ids, [batch_id] * len(request_ids), token_ids)
