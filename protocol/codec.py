"""MessagePack codec with validation: a bad frame raises ProtocolError, nothing else.

Values are checked as well as shapes: every int within int64, every float finite, the lower bounds the
messages declare (protocol.wire: RequestId, Count, Length), and each message's own `is_valid`. A nested
row (a dataclass inside a message: RequestRow, FailedRow, the RequestMsg inside a RequestRow or an Arrival)
travels as the array of its fields and is checked field by field and by its own `is_valid`, as a message is."""
import dataclasses
import math
import typing

import msgpack

from batchlab.protocol.errors import ProtocolError
from batchlab.protocol.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Bundle, Kind, TokenBytes
from batchlab.protocol.wire import INT64_MAX, INT64_MIN, AtLeast

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # larger frames are rejected before unpacking
# msgpack builds a container at its header, before its elements are read: an array header of 5 bytes
# claiming n elements costs 8n bytes at once. So every length is capped by what a legal message holds.
# The longest array is a list with one entry per request of one batch or step (Dispatch.requests,
# Tokens.token_ids, BatchDone.finished): a million is far above any worker's rows (vLLM: max_num_seqs).
MAX_ARRAY_LEN = 1 << 20
MAX_MAP_LEN = 1 << 16  # dict fields (settings, facts, stats) hold dozens of named values
# A str or bin is built only once all its bytes are in the frame, so the frame limit is its only bound
# (TokenBytes of one long prompt may fill a frame). No message holds an ext type.
_UNPACK_LIMITS = {"max_array_len": MAX_ARRAY_LEN, "max_map_len": MAX_MAP_LEN, "max_str_len": MAX_MESSAGE_BYTES,
                  "max_bin_len": MAX_MESSAGE_BYTES, "max_ext_len": 0}


def _is_int(v: object) -> bool:
    return type(v) is int and INT64_MIN <= v <= INT64_MAX


def _check_list_of(kind: type, minimum: int = INT64_MIN) -> typing.Callable[[object], bool]:
    """A list whose elements are exactly `kind` (bool is not int), ints within [minimum, INT64_MAX]: the
    type scan runs in C (set(map(type, v)), then min and max), about half the cost of a per-element
    Python check on prompt token lists."""
    only = frozenset((kind,))
    if kind is not int:
        return lambda v: type(v) is list and set(map(type, v)) <= only
    return lambda v: (type(v) is list and set(map(type, v)) <= only
                      and (not v or (min(v) >= minimum and max(v) <= INT64_MAX)))


_CHECKS: dict[object, typing.Callable[[object], bool]] = {
    int: _is_int,
    float: lambda v: (type(v) is float and math.isfinite(v)) or _is_int(v),  # no time, rate or size is NaN or inf
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    dict: lambda v: type(v) is dict,
    list[int]: _check_list_of(int),
    list[str]: _check_list_of(str),
    TokenBytes: lambda v: type(v) is bytes and len(v) % 4 == 0,
}
_Build = typing.Callable[[object], object] | None  # a nested row's array → the row (None: the value as is)


class _Row:
    """A nested row type (a dataclass inside a message, e.g. RequestRow): the array of its fields,
    each checked as a message's field is, built into the dataclass on decode."""

    def __init__(self, cls: type) -> None:
        self.cls, self.fields, self.is_valid = cls, _fields(cls), getattr(cls, "is_valid", None)

    def check(self, v: object) -> bool:
        return (type(v) is list and len(v) == len(self.fields)
                and all(check(x) for (_, check, _), x in zip(self.fields, v)))

    def build(self, v: list) -> object:
        """The row, its own cross-field check applied as a message's is (a RequestMsg's tokens vs prompt_len)."""
        row = self.cls(*[x if build is None else build(x) for (_, _, build), x in zip(self.fields, v)])
        if self.is_valid is not None and not self.is_valid(row):
            raise ProtocolError(f"{self.cls.__name__}: inconsistent fields")
        return row


def _field(hint: object) -> tuple[typing.Callable[[object], bool], _Build]:
    """(check, build) of one field's type hint: a nested row (or a list of them) is built on decode."""
    item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
    if dataclasses.is_dataclass(hint):
        row = _Row(hint)
        return row.check, row.build
    if dataclasses.is_dataclass(item):
        row = _Row(item)
        return (lambda v: type(v) is list and all(map(row.check, v))), (lambda v: [row.build(x) for x in v])
    return _check_of(hint), None


def _fields(cls: type) -> list[tuple[str, typing.Callable[[object], bool], _Build]]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return [(f.name, *_field(hints[f.name])) for f in dataclasses.fields(cls)]


def _check_of(hint: object) -> typing.Callable[[object], bool]:
    """The check of one plain field's type hint; an Annotated int (protocol.wire's RequestId, Count, ...)
    adds its AtLeast bound, also inside a list."""
    if typing.get_origin(hint) is typing.Annotated:
        check, minimum = _CHECKS[hint.__origin__], _minimum(hint)
        return lambda v: check(v) and v >= minimum
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if typing.get_origin(item) is typing.Annotated:
            return _check_list_of(item.__origin__, _minimum(item))
    return _CHECKS[hint]


def _minimum(hint: object) -> int:
    return next(m.minimum for m in hint.__metadata__ if isinstance(m, AtLeast))


def _spec(cls: type) -> tuple[type, list, int, typing.Callable | None]:
    """(class, [(field, check, build)], required fields, cross-field check or None) for one message type."""
    fields = _fields(cls)
    required = sum(
        1 for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return cls, fields, required, getattr(cls, "is_valid", None)


_BUNDLE = int(Kind.BUNDLE)
_SPECS = {int(cls.KIND): _spec(cls) for cls in MESSAGE_TYPES if cls is not Bundle}
_KINDS = {cls: int(cls.KIND) for cls in MESSAGE_TYPES}


def _wire(msg: object) -> list:
    """[kind, *fields] of one message (not a Bundle)."""
    return [_KINDS[type(msg)], *[getattr(msg, name) for name in msg.__slots__]]


def _row_array(row: object) -> list:
    """A nested row (msgpack's hook for a type it does not know): the array of its fields."""
    if not dataclasses.is_dataclass(row):
        raise TypeError(f"cannot encode {type(row).__name__}")
    return [getattr(row, name) for name in row.__slots__]


def _pack(arr: list) -> bytes:
    return msgpack.packb(arr, use_bin_type=True, default=_row_array)


def encode(msg: object) -> bytes:
    """One message → bytes: [version, kind, *fields] (a Bundle: [version, BUNDLE, [[kind, *fields], ...]])."""
    if type(msg) is Bundle:
        return encode_many(msg.messages)
    return _pack([PROTOCOL_VERSION, *_wire(msg)])


def encode_many(msgs: list) -> bytes:
    """Several messages → one frame: a lone message as itself, more as a Bundle (in order)."""
    if len(msgs) == 1:
        return encode(msgs[0])
    return _pack([PROTOCOL_VERSION, _BUNDLE, [_wire(m) for m in msgs]])


def split_frames(msgs: list, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[list[bytes], list[str]]:
    """Messages → frames, in order, each within `max_bytes` (encode_many of runs halved until each fits),
    and why each message that does not fit alone was left out: it is never sent (its peer would drop
    the connection), the reason names its size and the limit."""
    frame = encode_many(msgs) if msgs else b""
    if len(frame) <= max_bytes:
        return ([frame] if msgs else []), []
    if len(msgs) == 1:
        return [], [f"{type(msgs[0]).__name__} of {len(frame)} bytes exceeds the {max_bytes}-byte frame limit"]
    half = len(msgs) // 2
    head, tail = split_frames(msgs[:half], max_bytes), split_frames(msgs[half:], max_bytes)
    return head[0] + tail[0], head[1] + tail[1]


def decode(frame: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> object:
    """Bytes → a validated message (a Bundle holds its decoded messages), or ProtocolError."""
    arr = _unpack(frame, max_bytes)
    if arr[1] == _BUNDLE and type(arr[1]) is int:
        return Bundle(_bundled(arr))
    return _build(arr[1], arr, 2)


def decode_all(frame: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> list:
    """Bytes → the validated messages the frame carries, in order (a Bundle's, or the one), or ProtocolError."""
    msg = decode(frame, max_bytes)
    return msg.messages if type(msg) is Bundle else [msg]


def _unpack(frame: bytes, max_bytes: int) -> list:
    """The frame's [version, kind, ...] array, its size and version checked."""
    if len(frame) > max_bytes:
        raise ProtocolError(f"message of {len(frame)} bytes exceeds the {max_bytes}-byte limit")
    try:
        arr = msgpack.unpackb(frame, raw=False, strict_map_key=True, **_UNPACK_LIMITS)
    except Exception as exc:  # msgpack raises several types for bad input
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}: {exc}") from None
    if type(arr) is not list or len(arr) < 2:
        raise ProtocolError("frame is not a [version, kind, ...] array")
    if arr[0] != PROTOCOL_VERSION or type(arr[0]) is not int:
        raise ProtocolError(f"protocol version {arr[0]!r}, expected {PROTOCOL_VERSION}")
    return arr


def _bundled(arr: list) -> list:
    """A Bundle's messages, each validated as if it came alone."""
    if len(arr) != 3 or type(arr[2]) is not list:
        raise ProtocolError("Bundle: expected one list of [kind, *fields] arrays")
    out = []
    for inner in arr[2]:
        if type(inner) is not list or not inner:
            raise ProtocolError(f"Bundle: {inner!r:.60} is not a [kind, *fields] array")
        out.append(_build(inner[0], inner, 1))
    return out


def _built(cls: type, name: str, build: typing.Callable[[object], object], value: object) -> object:
    """A nested row field built; its refusal names the message and the field."""
    try:
        return build(value)
    except ProtocolError as exc:
        raise ProtocolError(f"{cls.__name__}.{name}: {exc}") from None


def _build(kind: object, arr: list, first: int) -> object:
    """The message of `kind` whose fields are arr[first:], validated."""
    spec = _SPECS.get(kind) if type(kind) is int else None
    if spec is None:
        raise ProtocolError("Bundle inside a Bundle" if kind == _BUNDLE else f"unknown message kind {kind!r}")
    cls, fields, required, is_valid = spec
    values = arr[first:]
    if not required <= len(values) <= len(fields):
        raise ProtocolError(f"{cls.__name__}: {len(values)} fields, expected {len(fields)}")
    for (name, check, _), value in zip(fields, values):
        if not check(value):
            raise ProtocolError(f"{cls.__name__}.{name}: bad value {value!r:.60}")
    msg = cls(*[v if build is None else _built(cls, name, build, v) for (name, _, build), v in zip(fields, values)])
    if is_valid is not None and not is_valid(msg):
        raise ProtocolError(f"{cls.__name__}: inconsistent fields")
    return msg
