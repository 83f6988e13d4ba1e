"""traffic.process against a real ZeroMQ ROUTER standing in for the scheduler."""
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import zmq

from batchlab.protocol import (ClockPing, ClockPong, EndOfStream, EndOfStreamAck, Heartbeat, RequestMsg, Shutdown,
                               Start, TrafficHello, decode, encode, now)
from batchlab.protocol.messages import unpack_tokens
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.process import TrafficStartTimeout, run_traffic
from batchlab.traffic.schedule import Schedule, build_schedule, load_schedule

START_DELAY_S = 0.05


@dataclass(slots=True)
class FakeScheduler:
    """A ROUTER that answers the hello with Start(now() + 0.05) and records everything it receives."""

    address: str
    shutdown_after: int | None = None  # send Shutdown after this many requests
    answer_hello: bool = True
    start_on_heartbeat: bool = False  # answer the hello only once a heartbeat came
    skew_s: float = 0.0  # this fake's clock runs this far ahead of the traffic's (another host)
    stall_s: float = 0.0  # reads nothing this long after its first request (a stopped scheduler)
    recv_hwm: int = 1000  # frames its socket takes in while it does not read
    ack: bool = True  # answers the EndOfStream
    heartbeats: list[Heartbeat] = field(default_factory=list)
    hello: TrafficHello | None = None
    t0: float = 0.0
    requests: list[RequestMsg] = field(default_factory=list)
    end: EndOfStream | None = None
    thread: threading.Thread | None = None

    def start(self) -> "FakeScheduler":
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, self.recv_hwm)
        sock.bind(self.address)
        self.thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
        self.thread.start()
        return self

    def _serve(self, sock: zmq.Socket) -> None:
        try:
            while self.end is None:
                identity, frame = sock.recv_multipart()
                self._handle(sock, identity, decode(frame))
        except zmq.Again:
            pass
        finally:
            sock.close()

    def _handle(self, sock: zmq.Socket, identity: bytes, msg: object) -> None:
        if isinstance(msg, TrafficHello):
            self.hello = msg
            if self.answer_hello and not self.start_on_heartbeat:
                self._start(sock, identity)
        elif isinstance(msg, Heartbeat):
            self.heartbeats.append(msg)
            if self.start_on_heartbeat and not self.t0:
                self._start(sock, identity)
        elif isinstance(msg, RequestMsg):
            self.requests.append(msg)
            if len(self.requests) == 1:
                time.sleep(self.stall_s)
            if len(self.requests) == self.shutdown_after:
                sock.send_multipart([identity, encode(Shutdown("test"))])
        elif isinstance(msg, EndOfStream):
            self.end = msg
            if self.ack:
                sock.send_multipart([identity, encode(EndOfStreamAck(len(self.requests)))])
        elif isinstance(msg, ClockPing):
            sock.send_multipart([identity, encode(ClockPong(msg.seq, msg.t_send, now() + self.skew_s))])

    def _start(self, sock: zmq.Socket, identity: bytes) -> None:
        sock.send_multipart([identity, b"\xc1garbage"])  # a bad frame is logged and ignored
        self.t0 = now() + self.skew_s + START_DELAY_S
        sock.send_multipart([identity, encode(Start(self.t0))])

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=15)


def _schedule(rate: float, duration_s: float) -> Schedule:
    cfg = TrafficConfig(arrival="poisson", rate=rate, duration_s=duration_s, dataset="synthetic", seed=5)
    return build_schedule(cfg, None)


def test_every_request_arrives_at_t0_plus_its_offset(tmp_path: Path) -> None:
    schedule = _schedule(rate=300.0, duration_s=0.5)
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock").start()
    sent = run_traffic(schedule, fake.address, out_dir=tmp_path, start_timeout_s=5)
    fake.join()
    frame = schedule.frame
    assert fake.hello == TrafficHello(len(frame), schedule.content_hash, 0.5)
    assert sent == len(frame) == len(fake.requests) and fake.end == EndOfStream(len(frame))
    assert [r.request_id for r in fake.requests] == frame["request_id"].tolist()
    for req, offset, tokens in zip(fake.requests, frame["arrival_offset_s"], frame["prompt_tokens"]):
        assert req.arrival_time == fake.t0 + offset
        assert req.send_time >= req.arrival_time - 1e-3
        assert unpack_tokens(req.prompt_tokens) == list(tokens) and req.prompt_len == len(tokens)
    assert load_schedule(tmp_path / "schedule.parquet").content_hash == schedule.content_hash


def test_shutdown_from_scheduler_stops_sending_and_reports_the_real_count(tmp_path: Path) -> None:
    schedule = _schedule(rate=20.0, duration_s=30.0)
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", shutdown_after=3).start()
    started = now()
    sent = run_traffic(schedule, fake.address, out_dir=None, start_timeout_s=5)
    fake.join()
    assert now() - started < 5.0
    assert sent == len(fake.requests) == fake.end.sent
    assert 3 <= sent < schedule.n_requests


def test_the_traffic_keeps_its_queued_frames_until_a_stalled_scheduler_took_the_stream(tmp_path: Path) -> None:
    # A high rate, and a scheduler stopped at the first request for longer than the old 2 s linger: its
    # socket takes in 10 frames, so the rest of 10,000 wait in the traffic's own queue (a close drops them).
    schedule = _schedule(rate=20_000.0, duration_s=0.5)
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", stall_s=4.0, recv_hwm=10).start()
    sent = run_traffic(schedule, fake.address, out_dir=None, start_timeout_s=5, liveness_s=60)
    fake.join()
    assert sent == schedule.n_requests and fake.end == EndOfStream(sent)
    assert [r.request_id for r in fake.requests] == schedule.frame["request_id"].tolist()


def test_without_an_ack_the_traffic_gives_up_after_its_liveness_window(tmp_path: Path) -> None:
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", ack=False).start()
    started = now()
    sent = run_traffic(_schedule(rate=20.0, duration_s=0.5), fake.address, out_dir=None, start_timeout_s=5,
                       liveness_s=1.0)
    fake.join()
    assert fake.end == EndOfStream(sent) and 1.0 <= now() - started < 30


def test_sigint_stops_sending_and_restores_the_old_handler(tmp_path: Path) -> None:
    schedule = _schedule(rate=20.0, duration_s=30.0)
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock").start()
    before = signal.getsignal(signal.SIGINT)
    def interrupt_once_sending() -> None:
        deadline = now() + 10
        while not fake.requests and now() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_sending, daemon=True).start()
    sent = run_traffic(schedule, fake.address, out_dir=None, start_timeout_s=5)
    fake.join()
    assert 0 < sent < schedule.n_requests
    assert fake.end == EndOfStream(sent) and len(fake.requests) == sent
    assert signal.getsignal(signal.SIGINT) is before


def test_missing_start_raises_a_clear_timeout(tmp_path: Path) -> None:
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", answer_hello=False).start()
    with pytest.raises(TrafficStartTimeout, match="no Start"):
        run_traffic(_schedule(rate=5.0, duration_s=1.0), fake.address, out_dir=None, start_timeout_s=0.2)
    assert fake.hello is not None


def test_traffic_beats_while_waiting_for_start_and_between_sparse_requests(tmp_path: Path) -> None:
    # Two requests 3.5 heartbeat intervals apart: a beat falls due one interval after the first send,
    # so it lands between them unless the sender stalls for 2.5 intervals (the margin is this gap, not
    # a quiet machine).
    gap_s = 3.5 * HEARTBEAT_INTERVAL_S
    cfg = TrafficConfig(arrival="constant", rate=1 / gap_s, duration_s=gap_s + 0.5, dataset="synthetic")
    schedule = build_schedule(cfg, None)
    assert schedule.frame.arrival_offset_s.tolist() == pytest.approx([0.0, gap_s])
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", start_on_heartbeat=True).start()
    assert run_traffic(schedule, fake.address, out_dir=None, start_timeout_s=30) == 2
    fake.join()
    beat_times = [b.time for b in fake.heartbeats]
    assert beat_times[0] < fake.t0  # kept alive before Start
    assert any(fake.requests[0].send_time < t < fake.requests[1].send_time for t in beat_times)
    assert all(b.sender == "traffic" for b in fake.heartbeats)


def test_traffic_to_a_scheduler_on_another_host_sends_on_its_clock(tmp_path: Path, monkeypatch) -> None:
    import batchlab.traffic.process as tp

    monkeypatch.setattr(tp, "is_loopback", lambda _address: False)  # as if the scheduler were remote
    skew_s = 500.0
    cfg = TrafficConfig(arrival="constant", rate=4.0, duration_s=1.0, dataset="synthetic")
    schedule = build_schedule(cfg, None)
    fake = FakeScheduler(f"ipc://{tmp_path}/sched.sock", skew_s=skew_s).start()
    local_start = now()
    assert run_traffic(schedule, fake.address, out_dir=None, start_timeout_s=30) == len(schedule.frame)
    fake.join()
    offsets = schedule.frame.arrival_offset_s.tolist()
    for req, offset in zip(fake.requests, offsets):
        assert req.arrival_time == pytest.approx(fake.t0 + offset, abs=1e-6)  # planned, on its clock
        assert req.send_time - skew_s > local_start  # sent on our clock, stamped on the scheduler's
        assert req.send_time >= req.arrival_time - 0.01  # not early: the 500 s were taken out of the wait
