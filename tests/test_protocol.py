"""Protocol: every message round-trips; anything else is rejected with ProtocolError, never a crash."""
import os
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.protocol import PROTOCOL_VERSION, ProtocolError, decode, decode_all, encode, encode_many
from batchlab.protocol import messages as m
from batchlab.protocol.codec import MAX_ARRAY_LEN

# a few hundred examples find the decoder's crashes in seconds; 2,000 took minutes on a shared 2-core machine
EXAMPLES = int(os.environ.get("BATCHLAB_FUZZ_EXAMPLES", 300))  # more for a deeper search by hand
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

REQ = m.RequestMsg(1, 2.0, 2.001, 4, 5, m.pack_tokens([1, 2, 3, 4]))
REQ2 = m.RequestMsg(2, 2.0, 2.001, 3, 2, m.pack_tokens([5, 6, 7]))
SAMPLES = [
    m.TrafficHello(10, "abc", 5.0), m.Start(12.5), m.RequestMsg(1, 2.0, 2.001, 4, 5, m.pack_tokens([1, 2, 3, 4])),
    m.EndOfStream(10), m.EndOfStreamAck(10), m.RequestsEnded([3, 7], 4.5), m.TrafficHello(10, "abc", 5.0, 4),
    m.WorkerHello("w0", "sim", "tiny", "static", 8, 1024, 10**12, "cpu", "none", {"dtype": "float32"}),
    m.Dispatch(1.5, "age", [m.RequestRow(3, REQ), m.RequestRow(3, REQ2)]),
    m.BatchDone(3, "w0", 1.5, 2.5, [1], [m.FailedRow(2, "worker error: boom")], False, 123),
    m.Heartbeat("w0", 3.0), m.Shutdown("done"), m.WorkerCapacity("w0", 4, "out of memory with 8 rows"),
    m.ClockPing(1, 2.0), m.ClockPong(1, 2.0, 2.5),
    m.Tokens(0, 1.6, [1, 2], [3, 4], [11, 12]), m.Step("w0", 4, 1.0, 1.1, 3, 1, 0),
    m.Arrival(m.RequestMsg(1, 2.0, 2.001, 4, 5), 2.002), m.BatchLaunch("w0", 1.5, "size", [1, 2], [3, 3], 7),
    m.RequestFailed(1, "queue full", 2.0), m.RunInfo({"strategy": "naive", "rate": 5.0}),
    m.RunEnd(10, ["w0"], {"submitted": 10}), m.WorkerBye("w0", 100, "cpu_peak_rss", {}),
    m.CollectorAck("RunEnd"), m.CollectorAck("WorkerBye"),
    m.Dispatch(1.5, "credit", [m.RequestRow(4, REQ), m.RequestRow(5, REQ2)]),
    m.Bundle([m.Arrival(m.RequestMsg(1, 2.0, 2.001, 4, 5), 2.002), m.BatchLaunch("w0", 1.5, "size", [1], [3], 0),
              m.Tokens(0, 1.6, [1], [3], [11])]),
]


def test_every_message_type_has_a_sample():
    assert {type(s) for s in SAMPLES} == set(m.MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip_gives_an_equal_message(msg):
    assert decode(encode(msg)) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda s: type(s).__name__)
def test_truncated_frames_are_rejected(msg):
    frame = encode(msg)
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode(frame[:cut])


def test_wrong_version_is_rejected():
    frame = msgpack.packb([PROTOCOL_VERSION + 1, int(m.Kind.START), 1.0])
    with pytest.raises(ProtocolError, match="version"):
        decode(frame)


def test_unknown_kind_is_rejected():
    with pytest.raises(ProtocolError, match="unknown message kind"):
        decode(msgpack.packb([PROTOCOL_VERSION, 99, 1.0]))


def test_wrong_field_type_is_rejected():
    with pytest.raises(ProtocolError, match="request_id"):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.REQUEST), "x", 1.0, 1.0, 1, 1, []]))
    with pytest.raises(ProtocolError, match="prompt_tokens"):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.REQUEST), 1, 1.0, 1.0, 1, 1, b"\x01\x02\x03"]))


def test_malformed_rows_inside_a_dispatch_or_batch_done_are_rejected():
    request = [1, 2.0, 2.0, 4, 4, b""]
    for rows in ([[1, request[:5]]], [[1, [*request[:5], [4]]]], [[1, [1, 2.0, 2.0, "4", 4, b""]]], [[-1, request]],
                 [[1, 2, 3, 4, b""]], [1], [[1]]):
        with pytest.raises(ProtocolError, match="requests"):
            decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.DISPATCH), 1.0, "size", rows]))
    for failed in ([[1]], [[1, 2]], [[-1, "x"]], [1]):
        with pytest.raises(ProtocolError, match="failed"):
            decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.BATCH_DONE), 1, "w", 1.0, 2.0, [], failed]))


def test_decoded_rows_are_typed_rows_naming_their_batch():
    msg = decode(encode(m.Dispatch(1.0, "credit", [m.RequestRow(10, REQ), m.RequestRow(11, REQ2)])))
    assert [(type(r), r.batch_id, type(r.request), r.request.request_id) for r in msg.requests] == [
        (m.RequestRow, 10, m.RequestMsg, 1), (m.RequestRow, 11, m.RequestMsg, 2)]
    done = decode(encode(m.BatchDone(3, "w0", 1.5, 2.5, [], [m.FailedRow(2, "boom")])))
    assert done.failed == [m.FailedRow(2, "boom")]


@pytest.mark.parametrize("kind, fields", [
    (m.Kind.TOKENS, [0, 1.0, [1, 2], [3], [11, 12]]),  # a batch id short
    (m.Kind.TOKENS, [0, 1.0, [1], [3], [11, 12]]),
    (m.Kind.BATCH_LAUNCH, ["w0", 1.0, "size", [1, 2], [3], 0]),
])
def test_parallel_lists_of_unequal_length_are_rejected(kind, fields):
    with pytest.raises(ProtocolError, match="inconsistent"):
        decode(msgpack.packb([PROTOCOL_VERSION, int(kind), *fields]))


def test_a_bundle_decodes_to_its_messages_in_order_and_a_lone_message_is_sent_bare():
    msgs = SAMPLES[:5]
    assert decode_all(encode_many(msgs)) == msgs
    assert decode(encode_many(msgs)) == m.Bundle(msgs)
    assert encode_many([SAMPLES[0]]) == encode(SAMPLES[0])
    assert decode_all(encode(SAMPLES[0])) == [SAMPLES[0]]


@pytest.mark.parametrize("inner", [
    [[int(m.Kind.START), "late"]],  # a bad field inside
    [[int(m.Kind.START), 1.0], [99, 1]],  # an unknown kind inside
    [[int(m.Kind.BUNDLE), [[int(m.Kind.START), 1.0]]]],  # bundles do not nest
    [[]], [5], "not a list",
], ids=["bad-field", "unknown-kind", "nested", "empty-inner", "not-an-array", "not-a-list"])
def test_a_malformed_bundle_is_rejected_whole(inner):
    frame = msgpack.packb([PROTOCOL_VERSION, int(m.Kind.BUNDLE), inner], use_bin_type=True)
    for decoder in (decode, decode_all):
        with pytest.raises(ProtocolError):
            decoder(frame)


def test_token_ids_survive_packing():
    ids = [0, 1, 31999, 2**32 - 1]
    assert m.unpack_tokens(m.pack_tokens(ids)) == ids


def test_missing_and_extra_fields_are_rejected():
    with pytest.raises(ProtocolError):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.START)]))
    with pytest.raises(ProtocolError):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.START), 1.0, 2.0]))


def test_oversized_frame_is_rejected_before_unpacking():
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(b"\x00" * 101, max_bytes=100)


def _peak_bytes_of_decoding(frame: bytes) -> int:
    """Peak Python allocation while `frame` is decoded (it must be rejected)."""
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            decode(frame)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_array_header_claiming_2_31_elements_is_rejected_before_allocating():
    assert _peak_bytes_of_decoding(b"\xdd" + (2**31).to_bytes(4, "big")) < 2**20


def test_nested_headers_claiming_more_than_any_message_holds_are_rejected_before_allocating():
    """Each header claims twice the longest legal array, within what the frame's size would allow: msgpack
    would build an 8-byte slot per claimed element (16 MiB a header) before reading any."""
    claim = 2 * MAX_ARRAY_LEN
    for header in (b"\xdd", b"\xdf"):  # array32, map32
        frame = (header + claim.to_bytes(4, "big")) * 8
        frame += b"\x00" * (claim - len(frame))
        assert _peak_bytes_of_decoding(frame) < 2**20


def test_an_ext_value_is_rejected():
    with pytest.raises(ProtocolError):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.RUN_INFO), {"t": msgpack.ExtType(1, b"x")}]))


def test_bool_is_not_an_int():
    with pytest.raises(ProtocolError):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.END_OF_STREAM), True]))


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_only_ever_raise_protocol_error(frame):
    try:
        decode(frame)
    except ProtocolError:
        pass


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True) | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12)


@FUZZ
@given(st.sampled_from([int(k) for k in m.Kind]), st.lists(_values, max_size=9))
def test_well_formed_msgpack_with_random_fields_decodes_or_raises_protocol_error(kind, fields):
    try:
        msg = decode(msgpack.packb([PROTOCOL_VERSION, kind, *fields], use_bin_type=True))
    except ProtocolError:
        return
    assert int(msg.KIND) == kind


def test_a_hello_without_a_concurrency_is_an_open_loop_traffic():
    hello = decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.TRAFFIC_HELLO), 10, "abc", 5.0]))
    assert hello.concurrency == 0


@pytest.mark.parametrize("fields", [
    [[-1], 1.0],  # a request id below 0
    [[1, "2"], 1.0],  # an id that is no int
    [[True], 1.0],  # a bool is no id
    [[1], float("nan")],  # a time that is no finite number
    [1, 1.0],  # ids that are no list
    [[1]],  # the time missing
])
def test_requests_ended_with_a_bad_field_is_rejected(fields):
    with pytest.raises(ProtocolError):
        decode(msgpack.packb([PROTOCOL_VERSION, int(m.Kind.REQUESTS_ENDED), *fields]))


def test_a_request_inside_a_dispatch_is_checked_as_a_top_level_one_is():
    """Its packed prompt holds exactly prompt_len tokens (2 tokens for 4, a million for 1: refused)."""
    for tokens, prompt_len in (([1, 2], 4), (range(1_000_000), 1)):
        bad = m.RequestMsg(1, 2.0, 2.0, prompt_len, 4, m.pack_tokens(tokens))
        with pytest.raises(ProtocolError, match="RequestMsg: inconsistent fields"):
            decode(encode(bad))
        with pytest.raises(ProtocolError, match="Dispatch.requests: RequestMsg: inconsistent fields"):
            decode(encode(m.Dispatch(1.0, "size", [m.RequestRow(0, REQ), m.RequestRow(0, bad)])))
