"""10,000 malformed frames at each receiving loop (scheduler, collector, worker, traffic): each is
counted and dropped, and the process keeps working."""
import json
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.protocol import (Dispatch, EndOfStream, ProtocolError, RequestMsg, RequestRow, Start, decode, decode_all,
                               encode)
from batchlab.protocol.messages import PROTOCOL_VERSION, Kind, pack_tokens
from tests.test_faults import COMMON, assert_conserved, finish, free_port, no_leftovers, start  # noqa: F401

pytestmark = pytest.mark.slow
N_FRAMES = 10_000

_fields = st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.floats(), st.text(max_size=8),
                             st.binary(max_size=8), st.lists(st.integers(0, 9), max_size=3)), max_size=8)
_frames = st.one_of(
    st.binary(max_size=64),  # raw garbage
    st.builds(lambda k, f: msgpack.packb([PROTOCOL_VERSION, k, *f]), st.integers(0, 40), _fields),  # bad fields
    st.builds(lambda v, f: msgpack.packb([v, int(Kind.REQUEST), *f]), st.integers(2, 9), _fields),  # version
    st.builds(lambda n: encode(RequestMsg(1, 0.0, 0.0, 4, 4, pack_tokens([1, 2, 3, 4])))[:n], st.integers(0, 20)),  # cut
)


HYPOTHESIS_FRAMES = 400  # drawn by hypothesis (its shapes); their cut and flipped variants fill the 10,000


def rejected(frame: bytes) -> bool:
    try:
        decode(frame)
    except ProtocolError:
        return True
    return False


def variants(frame: bytes):
    """Each prefix of a frame, then each with its last byte flipped: cheap, and still of its shape."""
    for n in range(len(frame)):
        yield frame[:n]
        if n:
            yield frame[:n - 1] + bytes([frame[n - 1] ^ 0xFF])


@pytest.fixture(scope="module")
def malformed() -> list[bytes]:
    """Hypothesis-generated frames that the decoder must reject, topped up to N_FRAMES with variants of them."""
    drawn: list[bytes] = []

    @settings(max_examples=HYPOTHESIS_FRAMES * 3, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_frames)
    def collect(frame: bytes) -> None:
        if len(drawn) < HYPOTHESIS_FRAMES and rejected(frame):
            drawn.append(frame)

    collect()
    frames, seen = list(drawn), set(drawn)
    for frame in drawn:
        fresh = [v for v in dict.fromkeys(variants(frame)) if v not in seen and rejected(v)]
        frames.extend(fresh)
        seen.update(fresh)
        if len(frames) >= N_FRAMES:
            break
    while len(frames) < N_FRAMES:  # top up with cut frames if hypothesis produced few
        frames.append(encode(EndOfStream(len(frames)))[:-1])
    return frames[:N_FRAMES]


def blast(sock: zmq.Socket, frames: list[bytes], prefix: list[bytes] | None = None) -> None:
    """Send every frame; a peer that is gone fails the test (zmq.Again) instead of blocking it forever."""
    sock.setsockopt(zmq.SNDTIMEO, 60_000)
    for frame in frames:
        sock.send_multipart([*(prefix or []), frame])


def test_scheduler_and_collector_count_and_survive_garbage(tmp_path, malformed):
    sched, coll = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    procs = {"collector": start("collector", "--address", coll, "--out", str(tmp_path)),
             "scheduler": start("scheduler", "--address", sched, "--collector", coll, "--out", str(tmp_path)),
             "worker": start("worker", "--backend", "sim", "--scheduler", sched, "--collector", coll)}
    ctx = zmq.Context()
    to_sched, to_coll = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)  # the collector is a ROUTER
    to_sched.connect(sched)
    to_coll.connect(coll)
    blast(to_sched, malformed)
    blast(to_coll, malformed)
    to_sched.close(linger=5000)
    to_coll.close(linger=5000)
    ctx.term()
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "10", "--duration", "2", "--scheduler", sched,
                             "--out", str(tmp_path))
    finish(procs)
    requests = assert_conserved(tmp_path)
    assert set(requests.status) == {"finished"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rejected_messages"] == N_FRAMES
    assert summary["scheduler_stats"]["rejected_messages"] == N_FRAMES


def serve_pongs(router: zmq.Socket, until_kind: type, timeout_s: float = 60) -> tuple[bytes, object]:
    """Play the scheduler until a message of `until_kind` arrives (answering clock pings)."""
    from batchlab.protocol import ClockPing, ClockPong

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not router.poll(100):
            continue
        ident, frame = router.recv_multipart()
        msg = decode(frame)
        if isinstance(msg, ClockPing):
            router.send_multipart([ident, encode(ClockPong(msg.seq, msg.t_send, time.monotonic()))])
        elif isinstance(msg, until_kind):
            return ident, msg
    raise AssertionError(f"no {until_kind.__name__} within {timeout_s} s")


def test_worker_counts_garbage_and_still_runs_a_batch(malformed):
    from batchlab.protocol import BatchDone, WorkerBye, WorkerHello

    sched, coll = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    router, pull = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)  # the scheduler's, the collector's
    router.setsockopt(zmq.SNDHWM, 0)  # a ROUTER drops past its high-water mark: keep every frame
    router.bind(sched)
    pull.bind(coll)
    worker = start("worker", "--backend", "echo", "--scheduler", sched, "--collector", coll)
    try:
        ident, _hello = serve_pongs(router, WorkerHello)
        blast(router, malformed, prefix=[ident])
        router.send_multipart([ident, encode(Dispatch(0.0, "size", [RequestRow(0, RequestMsg(7, 0.0, 0.0, 4, 3, pack_tokens([1, 2, 3, 4])))]))])
        _, done = serve_pongs(router, BatchDone)
        assert done.finished == [7]
        worker.terminate()
        worker.wait(timeout=30)
        bye = None
        while pull.poll(2000):
            for msg in decode_all(pull.recv_multipart()[-1]):  # a worker bundles a step's records
                bye = msg if isinstance(msg, WorkerBye) else bye
        assert bye is not None and bye.stats["rejected_messages"] == N_FRAMES
    finally:
        worker.kill()
        router.close(linger=0)
        pull.close(linger=0)
        ctx.term()


def test_traffic_ignores_garbage_and_sends_its_schedule(tmp_path, malformed):
    from batchlab.protocol import EndOfStreamAck, TrafficHello

    sched = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.SNDHWM, 0)  # a ROUTER drops past its high-water mark: keep every frame
    router.bind(sched)
    traffic = start("traffic", *COMMON[2:], "--rate", "20", "--duration", "1", "--scheduler", sched,
                    "--out", str(tmp_path))
    try:
        ident, hello = serve_pongs(router, TrafficHello)
        blast(router, malformed, prefix=[ident])
        router.send_multipart([ident, encode(Start(time.monotonic() + 0.2))])
        _, eos = serve_pongs(router, EndOfStream)
        assert eos.sent == hello.n_requests > 0
        router.send_multipart([ident, encode(EndOfStreamAck(eos.sent))])  # the traffic may close: all taken
        traffic.wait(timeout=30)
        assert traffic.returncode == 0
    finally:
        traffic.kill()
        router.close(linger=0)
        ctx.term()
