"""Wire protocol: every message batchlab sends, its codec, clock and sockets. The names below are imported on
first use, so a process that needs one module of this package (a command's signal handling as it starts, in
its first tenths of a second) imports no other."""
from importlib import import_module

_CODEC = ("ProtocolError", "decode", "decode_all", "encode", "encode_many")
_MESSAGES = ("PROTOCOL_VERSION", "Kind", "Arrival", "BatchDone", "BatchLaunch", "Bundle", "ClockPing", "ClockPong",
             "CollectorAck", "Dispatch", "EndOfStream", "EndOfStreamAck", "FailedRow", "Heartbeat", "RequestFailed",
             "RequestMsg", "RequestRow", "RequestsEnded", "RunEnd", "RunInfo", "Shutdown", "Start", "Step", "Tokens",
             "TrafficHello", "WorkerBye", "WorkerCapacity", "WorkerHello")
_MODULE = {"now": "clock", **dict.fromkeys(_CODEC, "codec"), **dict.fromkeys(_MESSAGES, "messages")}

__all__ = ["now", *_CODEC, *_MESSAGES]


def __getattr__(name: str):
    if name not in _MODULE:
        raise AttributeError(f"module 'batchlab.protocol' has no attribute {name!r}")
    value = getattr(import_module(f"batchlab.protocol.{_MODULE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
