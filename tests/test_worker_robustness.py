"""Worker robustness: a continuous worker's row cap reaches the scheduler's credit and probes back up;
a worker that rejoins under its id loses no request; a continuous step that raises fails its rows once
and leaves the worker idle and serving. Real Scheduler and Worker loops run in threads against fake
peers on loopback sockets; every wait polls for its condition until a generous deadline."""
import itertools
import threading
import time
from collections.abc import Callable

import msgpack
import pytest
import torch
import zmq

from batchlab.protocol import (BatchDone, ClockPing, ClockPong, CollectorAck, Dispatch, EndOfStream, FailedRow,
                               Heartbeat, ProtocolError, RequestFailed, RequestMsg, RequestRow, RunEnd, Shutdown,
                               Start, Tokens, TrafficHello, WorkerBye, WorkerCapacity, WorkerHello, decode,
                               decode_all, encode, now)
from batchlab.protocol.clock import sleep_until
from batchlab.protocol.messages import PROTOCOL_VERSION, Kind, pack_tokens
from batchlab.scheduler.policies import make_policy
from batchlab.scheduler.process import Scheduler
from tests.test_faults import free_port
from batchlab.worker.hf import continuous
from batchlab.worker.backend import BackendRequest
from batchlab.worker.hf.static import HFSettings
from batchlab.worker.process import Worker
from batchlab.worker.sim import SimBackend

DEADLINE_S = 60.0  # generous: every wait ends as soon as its condition holds
BEAT_S = 0.3  # fake peers beat this often, well inside the 3 s (3 × 1 s) liveness limit
POLL_MS = 50
WORKER = "w0"
PROMPT = [1, 2, 3, 4]


def tcp() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def hello(max_rows: int = 4) -> WorkerHello:
    """A continuous worker with KV to spare: only rows limit its credit."""
    return WorkerHello(WORKER, "sim", "fake", "continuous", max_rows, 1, 10**12, "cpu", "none")


def request(rid: int) -> RequestMsg:
    t = now()
    return RequestMsg(rid, t, t, len(PROMPT), 4, pack_tokens(PROMPT))


def row(batch_id: int, rid: int, output_len: int = 4) -> RequestRow:
    """A Dispatch's row: request `rid` (the PROMPT, `output_len` tokens) in batch `batch_id`."""
    return RequestRow(batch_id, RequestMsg(rid, 0.0, 0.0, len(PROMPT), output_len, pack_tokens(PROMPT)))


def is_dispatch(msg: object) -> bool:
    return isinstance(msg, Dispatch)


def dispatched(seen: list[object]) -> list[int]:
    """Request ids in the Dispatches seen so far, in order."""
    return [r.request.request_id for m in seen if isinstance(m, Dispatch) for r in m.requests]


# --- a real Scheduler with a fake traffic and a fake worker -------------------------------------------
class Peer:
    """A fake process on one DEALER socket: it beats while it waits and keeps what it read."""

    def __init__(self, ctx: zmq.Context, address: str, identity: str) -> None:
        self.identity, self.seen, self.last_beat = identity, [], 0.0
        self.others: list[Peer] = []  # beaten for while this one waits (the scheduler hears every peer)
        self.on_poll: Callable[[], None] | None = None  # the rig's other duties while this one waits
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, identity.encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.pings = itertools.count()

    def send(self, msg: object) -> None:
        self.sock.send(encode(msg))

    def wait_for(self, cond: Callable[[object], bool]) -> object:
        """Read until a message satisfies `cond` (beating meanwhile, so the scheduler never loses us)."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            msg = self.read_one()
            if msg is not None and cond(msg):
                return msg
        raise AssertionError(f"{self.identity}: no match within {DEADLINE_S} s; last seen {self.seen[-3:]}")

    def read_one(self) -> object | None:
        """Beat every peer (and answer the collector's part), then the next message within POLL_MS (kept in
        `seen`), or None."""
        for peer in (self, *self.others):
            peer.beat()
        if self.on_poll is not None:
            self.on_poll()
        if not self.sock.poll(POLL_MS):
            return None
        msg = decode(self.sock.recv())
        self.seen.append(msg)
        return msg

    def beat(self) -> None:
        """A Heartbeat every BEAT_S."""
        if time.monotonic() - self.last_beat > BEAT_S:
            self.send(Heartbeat(self.identity, now()))
            self.last_beat = time.monotonic()

    def settled(self) -> None:
        """Return once the scheduler handled all we sent before and scheduled after it: it answers pings
        in order, and a second ping is read in a later loop pass than the first one's schedule step."""
        for _ in range(2):
            seq = next(self.pings)
            self.send(ClockPing(seq, now()))
            self.wait_for(lambda m, s=seq: isinstance(m, ClockPong) and m.seq == s)


class SchedulerRig:
    """A real Scheduler (continuous policy) in a thread; the test plays traffic, one worker and the collector."""

    def __init__(self) -> None:
        sched_addr, coll_addr = tcp(), tcp()
        self.sched_addr = sched_addr
        self.ctx = zmq.Context()
        self.collector = self.ctx.socket(zmq.ROUTER)
        self.collector.bind(coll_addr)
        self.recorded: list[object] = []
        self.sched = Scheduler(make_policy("continuous", max_batch_size=16), sched_addr, coll_addr)
        self.thread = threading.Thread(target=self.sched.run, name="scheduler", daemon=True)
        self.thread.start()
        self.worker = Peer(self.ctx, sched_addr, WORKER)
        self.traffic = Peer(self.ctx, sched_addr, "traffic")
        self.worker.others, self.traffic.others = [self.traffic], [self.worker]
        self.worker.on_poll = self.traffic.on_poll = self.serve_collector

    def serve_collector(self) -> list[object]:
        """What the scheduler sent the collector since the last call (kept in `recorded`); its heartbeats
        answered, as the collector does (the traffic starts once the collector was heard)."""
        new = []
        while self.collector.poll(0):
            ident, frame = self.collector.recv_multipart()
            for msg in decode_all(frame):  # the scheduler bundles a pass's records
                if isinstance(msg, Heartbeat):
                    self.collector.send_multipart([ident, encode(Heartbeat("collector", now()))])
                else:
                    new.append(msg)
        self.recorded += new
        return new

    def join(self, max_rows: int = 4) -> None:
        """The worker says hello and the traffic is told to start."""
        self.worker.send(hello(max_rows))
        self.worker.settled()
        self.traffic.send(TrafficHello(10, "hash", 1.0))
        start = self.traffic.wait_for(lambda m: isinstance(m, Start))
        sleep_until(start.t0)  # a request sent now is due (planned at or after the Start's t0), as a real one is

    def recorded_until(self, cond: Callable[[object], bool]) -> object:
        """What the scheduler sent the collector, read until a message satisfies `cond`."""
        deadline = time.monotonic() + DEADLINE_S
        seen = len(self.recorded)
        while time.monotonic() < deadline:
            self.worker.read_one()  # beats both peers, and reads what the collector got
            for msg in self.recorded[seen:]:
                seen += 1
                if cond(msg):
                    return msg
        raise AssertionError(f"the collector got no match within {DEADLINE_S} s")

    def close(self) -> None:
        self.sched.stopping, self.sched.stop_signal = True, 15  # as SIGTERM: no long wait for the collector's ack
        self.thread.join(timeout=DEADLINE_S)
        self.sched.close()
        for sock in (self.worker.sock, self.traffic.sock, self.collector):
            sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def rig():
    r = SchedulerRig()
    yield r
    r.close()


def test_a_reported_row_cap_replaces_the_hellos_in_the_workers_credit(rig):
    rig.join(max_rows=4)
    rig.worker.send(WorkerCapacity(WORKER, 1, "out of memory"))
    rig.worker.settled()
    for rid in range(6):
        rig.traffic.send(request(rid))
    rig.traffic.settled()
    rig.worker.settled()
    assert dispatched(rig.worker.seen) == [0]  # credit = reported cap 1 − 1 running, not the hello's 4
    rig.worker.send(WorkerCapacity(WORKER, 2, "probe"))
    rig.worker.settled()
    assert dispatched(rig.worker.seen) == [0, 1]
    rig.worker.send(WorkerCapacity(WORKER, 99, "probe"))  # never above the announced maximum
    rig.worker.settled()
    assert dispatched(rig.worker.seen) == [0, 1, 2, 3]


def test_a_worker_that_rejoins_under_its_id_gets_its_running_request_again_then_a_reason(rig):
    rig.join()
    rig.traffic.send(request(7))
    first = rig.worker.wait_for(is_dispatch)
    rig.worker.send(hello())  # a restart: what the old process ran is gone
    again = rig.worker.wait_for(is_dispatch)
    assert again.requests[0].request.request_id == 7 and again.requests[0].batch_id != first.requests[0].batch_id
    rig.worker.send(hello())  # a second restart: its one requeue is spent
    failed = rig.recorded_until(lambda m: isinstance(m, RequestFailed))
    assert (failed.request_id, failed.reason) == (7, "worker rejoined: its running requests were lost")
    rig.traffic.send(EndOfStream(1))
    end = rig.recorded_until(lambda m: isinstance(m, RunEnd))
    assert end.stats["workers_rejoined"] == 2 and end.stats["workers_lost"] == 0


# --- a real Worker with a fake scheduler -------------------------------------------------------------
class WorkerRig:
    """A real Worker in a thread; the test plays its scheduler and its collector (both ROUTERs)."""

    def __init__(self, backend) -> None:
        sched_addr, coll_addr = tcp(), tcp()
        self.ctx = zmq.Context()
        self.router, self.collector = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.ROUTER)
        self.router.bind(sched_addr)
        self.collector.bind(coll_addr)
        self.seen: list[object] = []
        self.last_beat = 0.0
        self.backend = backend
        self.worker = Worker(backend, sched_addr, coll_addr, WORKER)
        self.thread = threading.Thread(target=self.worker.run, name="worker", daemon=True)
        self.thread.start()
        self.wait_for(lambda m: isinstance(m, WorkerHello))

    def wait_for(self, cond: Callable[[object], bool]) -> object:
        """Read what the worker sends until `cond` holds, answering its pings and beating."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self.seen and time.monotonic() - self.last_beat > BEAT_S:
                self.send(Heartbeat("scheduler", now()))
                self.last_beat = time.monotonic()
            if not self.router.poll(POLL_MS):
                continue
            ident, frame = self.router.recv_multipart()
            if ident != WORKER.encode():  # the worker's heartbeat thread
                continue
            for msg in decode_all(frame):  # a step's BatchDones come bundled
                self.seen.append(msg)
                if isinstance(msg, ClockPing):
                    self.send(ClockPong(msg.seq, msg.t_send, now()))
                elif cond(msg):
                    return msg
        raise AssertionError(f"no match from the worker within {DEADLINE_S} s; last seen {self.seen[-3:]}")

    def send(self, msg: object) -> None:
        self.router.send_multipart([WORKER.encode(), encode(msg)])

    def dispatch(self, batch_id: int, rows: list[tuple[int, int]]) -> BatchDone:
        """Dispatch (request_id, output_len) rows as one batch and wait for its BatchDone."""
        self.send(Dispatch(now(), "credit", [row(batch_id, rid, n) for rid, n in rows]))
        return self.wait_for(lambda m: isinstance(m, BatchDone) and m.batch_id == batch_id)

    def close(self) -> list[object]:
        """Shut the worker down; returns everything it sent the collector (through its WorkerBye, which is
        acknowledged as the collector does: the worker keeps its socket until then)."""
        self.send(Shutdown("test over"))
        self.thread.join(timeout=DEADLINE_S)
        closing = threading.Thread(target=self.worker.close, name="close", daemon=True)
        closing.start()
        recorded = []
        while not recorded or not isinstance(recorded[-1], WorkerBye):
            assert self.collector.poll(int(DEADLINE_S * 1000)), "no WorkerBye"
            ident, frame = self.collector.recv_multipart()
            recorded += decode_all(frame)
        self.collector.send_multipart([ident, encode(CollectorAck("WorkerBye"))])
        closing.join(timeout=DEADLINE_S)
        assert not closing.is_alive(), "the worker did not close after the collector's ack"
        self.router.close(linger=0)
        self.collector.close(linger=0)
        self.ctx.term()
        return recorded


class RaisesOnce(SimBackend):
    """The echo backend in continuous mode whose first step raises."""

    def __init__(self) -> None:
        super().__init__("echo", mode="continuous", max_batch_size=8, backend="echo")
        self.raised = False

    def step(self):
        if not self.raised:
            self.raised = True
            raise RuntimeError("boom")
        return super().step()


def test_a_step_that_raises_fails_its_rows_once_then_the_worker_idles_and_serves():
    rig = WorkerRig(RaisesOnce())
    try:
        done = rig.dispatch(0, [(1, 1000), (2, 1000)])  # long rows: a backend that kept them stays busy
        assert not rig.backend.has_work()
        assert done.finished == [] and sorted(done.failed, key=lambda r: r.request_id) == [
            FailedRow(1, "worker error: RuntimeError: boom"), FailedRow(2, "worker error: RuntimeError: boom")]
        again = rig.dispatch(1, [(3, 4)])
        assert again.finished == [3] and again.failed == []
    finally:
        recorded = rig.close()
    assert sum(isinstance(m, BatchDone) and m.batch_id == 0 for m in rig.seen) == 1
    tokens = [rid for m in recorded if isinstance(m, Tokens) for rid in m.request_ids]
    assert tokens == [3] * 4  # the failed rows never produced a token


class HalvesOnce(SimBackend):
    """The echo backend in continuous mode with a row cap that its first step halves, as an OOM would."""

    max_rows_reason = "out of memory (simulated)"

    def __init__(self) -> None:
        super().__init__("echo", mode="continuous", max_batch_size=8, backend="echo")

    @property
    def max_rows(self) -> int:
        return self.core.max_rows

    def step(self):
        if self.core.max_rows == self.info.max_batch_size:
            self.core.max_rows //= 2
        return super().step()


def test_the_worker_reports_its_backends_changed_row_cap_once():
    rig = WorkerRig(HalvesOnce())
    try:
        done = rig.dispatch(0, [(1, 5)])
        assert done.finished == [1]
    finally:
        rig.close()
    reports = [m for m in rig.seen if isinstance(m, WorkerCapacity)]
    assert reports == [WorkerCapacity(WORKER, 4, "out of memory (simulated)")]


# --- the HF continuous backend's row cap --------------------------------------------------------------
@pytest.mark.slow  # tiny-mistral on HF
def test_an_oom_halves_the_hf_row_cap_and_clean_steps_probe_it_back_to_the_announced_max(monkeypatch):
    probe_steps = 2
    monkeypatch.setattr(continuous, "CLEAN_STEPS_TO_PROBE", probe_steps)
    b = continuous.HFContinuousBackend(HFSettings(model="tiny-mistral", device="cpu", max_batch_size=8))
    model, raised = b.model, []

    def oom_once_in_decode(*args, **kwargs):
        if not raised and tuple(kwargs["input_ids"].shape) == (4, 1):  # the first decode of the 4 rows
            raised.append(True)
            raise torch.OutOfMemoryError("simulated")
        return model(*args, **kwargs)

    monkeypatch.setattr(b, "model", oom_once_in_decode)
    b.admit([BackendRequest.new(i, len(PROMPT), 20, PROMPT, i) for i in range(4)])
    caps, tokens = [], {}
    while b.has_work():
        out = b.step()
        assert not out.failed
        for rid in out.request_ids:
            tokens[rid] = tokens.get(rid, 0) + 1
        caps.append((b.max_rows, b.max_rows_reason))
    b.close()
    assert tokens == {i: 20 for i in range(4)}  # the preempted rows resumed; none lost a token
    changes = [(i, cap) for i, (cap, _) in enumerate(caps) if i and cap != caps[i - 1][0]]
    oom_step, halved = changes[0]
    assert caps[0][0] == 8 and halved == 2 and caps[oom_step][1].startswith("out of memory")
    probes = changes[1:]
    assert [cap for _, cap in probes] == list(range(3, 9))  # +1 at a time, up to the announced max
    assert [i for i, _ in probes] == [oom_step + probe_steps * k for k in range(1, 7)]
    assert caps[-1][0] == 8 and "probe" in caps[probes[0][0]][1]


# --- the message ------------------------------------------------------------------------------------
def test_worker_capacity_round_trips_and_bad_fields_are_rejected():
    msg = WorkerCapacity(WORKER, 4, "out of memory")
    assert decode(encode(msg)) == msg
    with pytest.raises(ProtocolError, match="max_rows"):
        decode(msgpack.packb([PROTOCOL_VERSION, int(Kind.WORKER_CAPACITY), WORKER, "4", "oom"]))
    with pytest.raises(ProtocolError):
        decode(encode(msg)[:-1])
