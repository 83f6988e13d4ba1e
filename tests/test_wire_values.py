"""Decoding checks values, not only shapes: every message type's fields with wrong types, NaN, ±inf,
2**63, 2**64 - 1 and out-of-range lengths are refused; colliding ids are refused and counted by the
scheduler; frames never pass the limit. In-process: the codec, the scheduler's receive-and-handle code
on a fake socket, the core."""
import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.protocol import ProtocolError, decode, decode_all, encode
from batchlab.protocol.codec import split_frames
from batchlab.protocol.messages import (PROTOCOL_VERSION, Arrival, Kind, RequestFailed, RequestMsg, RequestRow, RunEnd,
                                        Tokens, TrafficHello)
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.launch import Launch
from batchlab.scheduler.policies import make_policy
from batchlab.scheduler.process import Scheduler
from tests.test_faults import free_port
from tests.wire_cases import BAD_CASES, TOKENS, VALID, bad_frame, frame

FUZZ = settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: f"{type(c[0]).__name__}.{c[1]}={c[2]!r:.20}")
def test_every_field_refuses_wrong_types_and_out_of_range_numbers(case):
    msg, name, value = case
    with pytest.raises(ProtocolError, match=type(msg).__name__):
        decode(frame(msg, **{name: value}))


def test_every_valid_example_still_decodes_to_itself():
    assert [decode(encode(m)) for m in VALID] == VALID


@FUZZ
@given(st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True, allow_infinity=True))
def test_a_decoded_request_holds_only_ids_lengths_and_times_a_table_can_store(n, x):
    frames = [frame(RequestMsg(1, 1.0, 1.0, 4, 4, TOKENS), **{name: v})
              for name in ("request_id", "prompt_len", "output_len") for v in (n,)]
    frames += [frame(RequestMsg(1, 1.0, 1.0, 4, 4, TOKENS), arrival_time=x)]
    for f in frames:
        try:
            msg = decode(f)
        except ProtocolError:
            continue
        assert 0 <= msg.request_id < 2**63 and 1 <= msg.prompt_len < 2**63 and 1 <= msg.output_len < 2**63
        assert math.isfinite(msg.arrival_time)


def test_a_bundle_with_one_bad_inner_message_is_refused_whole():
    inner = [[int(Kind.TOKENS), 0, 1.0, [1], [0], [5]], [int(Kind.REQUEST_FAILED), 2**64 - 1, "x", 1.0]]
    with pytest.raises(ProtocolError, match="RequestFailed.request_id"):
        decode_all(msgpack.packb([PROTOCOL_VERSION, int(Kind.BUNDLE), inner]))
    assert decode_all(msgpack.packb([PROTOCOL_VERSION, int(Kind.BUNDLE), inner[:1]])) == [Tokens(0, 1.0, [1], [0], [5])]


# --- the scheduler: its receive and handle code fed a fake ROUTER -------------------------------------
class FakeRouter:
    """Queued [identity, frame] messages, read as scheduler/process.py reads its ROUTER."""

    def __init__(self, messages: list[list[bytes]]) -> None:
        self.frames, self.more = [], []
        for parts in messages:
            self.frames += parts
            self.more += [True] * (len(parts) - 1) + [False]

    def poll(self, _timeout_ms: int) -> bool:
        return bool(self.frames)

    def recv(self, _flags: int = 0) -> bytes:
        import zmq
        if not self.frames:
            raise zmq.Again()
        self.last_more = self.more.pop(0)
        return self.frames.pop(0)

    def getsockopt(self, _opt: int) -> int:
        return int(self.last_more)


class Capture:
    """A socket that decodes what is sent to it into `into`."""

    def __init__(self, into: list) -> None:
        self.into = into

    def send(self, frame: bytes, _flags: int = 0) -> None:
        self.into += decode_all(frame)


def request_frame(rid: int, prompt_len: int = 4, output_len: int = 4) -> bytes:
    return frame(RequestMsg(rid, 1.0, 1.0, 4, 4, TOKENS), request_id=rid, prompt_len=prompt_len,
                 output_len=output_len)


@FUZZ
@given(st.lists(st.one_of(st.integers(0, 20).map(lambda i: ("request", i)), bad_frame.map(lambda f: ("bad", f))),
                max_size=40))
def test_the_scheduler_counts_bad_frames_refuses_taken_ids_and_gives_each_request_one_end(items):
    sched = Scheduler(make_policy("naive", batch_size=4), f"tcp://127.0.0.1:{free_port()}",
                      f"tcp://127.0.0.1:{free_port()}")
    real, records = sched.inbox.sock, []
    sched.records.sock = Capture(records)
    try:
        hello = [b"traffic", encode(TrafficHello(21, "hash", 1.0))]  # its schedule: ids 0 .. 20
        sched.inbox.sock = FakeRouter([hello] + [[b"traffic", request_frame(v) if k == "request" else v]
                                                 for k, v in items])
        sched.gate.start(0.5)  # the traffic was told to start: its requests (planned at 1.0) are due
        for sender, msg in sched.inbox.receive(0):  # the loop's steps 1-2, as run() does them
            sched._handle(sender, msg)
            sched._forward()
        sched.core.end_of_stream()
        sched._finish("test over")  # no worker joined: every queued request fails with a reason
    finally:
        sched.inbox.sock = real
        sched.close()
    ids = [v for k, v in items if k == "request"]
    bad = sum(k == "bad" for k, _ in items)
    stats = next(r for r in records if isinstance(r, RunEnd)).stats
    assert stats["rejected_messages"] == bad  # every one counted, none became a request
    assert stats["submitted"] == len(set(ids))
    assert stats["duplicate_requests"] == len(ids) - len(set(ids))
    arrivals = [r.request.request_id for r in records if isinstance(r, Arrival)]
    ends = [r.request_id for r in records if isinstance(r, RequestFailed)]
    assert sorted(arrivals) == sorted(ends) == sorted(set(ids))  # one Arrival and one end per id


def test_the_core_refuses_a_request_whose_id_is_taken_and_keeps_the_first():
    core = SchedulerCore(make_policy("naive", batch_size=8))
    first, clash = RequestMsg(7, 0.0, 0.0, 128, 128), RequestMsg(7, 0.0, 0.0, 4, 4)
    assert core.on_request(first, 0.0) and not core.on_request(clash, 0.0)
    assert list(core.queue) == [first] and core.stats["submitted"] == 1 and core.stats["duplicate_requests"] == 1
    assert core.drain() == []  # no record for the refused one: the first keeps its id's only end


# --- frames within the limit ------------------------------------------------------------------------
def test_a_launch_too_large_for_one_frame_is_split_at_batches_and_a_lone_batch_fails_naming_size_and_limit():
    requests = [RequestMsg(i, 0.0, 0.0, 100, 4, TOKENS * 40) for i in range(4)]  # 640 bytes of tokens each
    launch = Launch("w0", "credit", [RequestRow(i, r) for i, r in enumerate(requests)], 0)
    frames, too_large = launch.frames(1.0, max_bytes=1000)
    assert too_large == [] and len(frames) > 1
    assert [row.batch_id for part, _ in frames for row in part.rows] == [0, 1, 2, 3]
    assert all(len(f) <= 1000 for _, f in frames)
    whole = Launch("w0", "full", [RequestRow(9, r) for r in requests], 0)
    frames, too_large = whole.frames(1.0, max_bytes=1000)
    assert frames == [] and [part.batch_ids() for part, _ in too_large] == [[9]]
    assert "over the 1000-byte frame limit" in too_large[0][1] and "4 rows" in too_large[0][1]


def test_an_unsendable_launch_fails_each_of_its_requests_once_and_frees_the_worker():
    from batchlab.protocol import WorkerHello
    core = SchedulerCore(make_policy("naive", batch_size=2))
    core.on_hello("w0", WorkerHello("w0", "sim", "m", "static", 2, 1, 10**12, "cpu", "none"), 0.0)
    for i in range(2):
        core.on_request(RequestMsg(i, 0.0, 0.0, 4, 4), 0.0)
    (launch,) = core.schedule(0.0).launches
    core.on_unsendable(launch, "dispatch of 2 rows is 99 bytes, over the 10-byte frame limit", 1.0)
    assert [(r.request_id, r.reason) for r in core.drain()] == [
        (0, "dispatch of 2 rows is 99 bytes, over the 10-byte frame limit"),
        (1, "dispatch of 2 rows is 99 bytes, over the 10-byte frame limit")]
    assert not core.workers["w0"].inflight


def test_records_are_split_into_frames_within_the_limit_and_one_too_large_alone_is_named():
    small = [RequestFailed(i, "x" * 50, 1.0) for i in range(40)]
    huge = RequestFailed(99, "y" * 5000, 1.0)
    frames, left_out = split_frames([*small[:20], huge, *small[20:]], max_bytes=1000)
    assert all(len(f) <= 1000 for f in frames)
    assert [m.request_id for f in frames for m in decode_all(f)] == list(range(40))
    assert len(left_out) == 1 and "RequestFailed of" in left_out[0] and "1000-byte frame limit" in left_out[0]
