"""Wire protocol: every message batchlab sends, its codec, clock and sockets."""
from batchlab.protocol.clock import now
from batchlab.protocol.codec import ProtocolError, decode, decode_all, encode, encode_many
from batchlab.protocol.messages import PROTOCOL_VERSION, Kind
from batchlab.protocol.messages import (Arrival, BatchDone, BatchLaunch, Bundle, ClockPing, ClockPong, CollectorAck,
                                        Dispatch,
                                        EndOfStream, EndOfStreamAck, FailedRow, Heartbeat, RequestFailed, RequestMsg, RequestRow, RequestsEnded, RunEnd, RunInfo, Shutdown,
                                        Start, Step, Tokens, TrafficHello, WorkerBye, WorkerCapacity, WorkerHello)

__all__ = [
    "PROTOCOL_VERSION", "Kind", "ProtocolError", "decode", "decode_all", "encode", "encode_many", "now",
    "Arrival", "BatchDone", "BatchLaunch", "Bundle", "ClockPing", "ClockPong", "CollectorAck", "Dispatch", "EndOfStream", "EndOfStreamAck", "FailedRow", "Heartbeat",
    "RequestFailed", "RequestMsg", "RequestRow", "RequestsEnded", "RunEnd", "RunInfo", "Shutdown", "Start", "Step", "Tokens", "TrafficHello",
    "WorkerBye", "WorkerCapacity", "WorkerHello",
]
