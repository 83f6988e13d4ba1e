"""What reaches a static worker during a batch is kept, in order: a Dispatch runs after the batch, a Shutdown
stops the worker (its batch and anything kept for later fail with a reason); a strategy that launches past a
worker's free rows is cut to them by the scheduler's core, so the run still ends with every request terminal.

The worker is a real process (run_worker on the sim backend) with the test as its scheduler and collector."""
import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import Callable

import pandas as pd
import pytest
import zmq

from batchlab.protocol import (BatchDone, ClockPing, ClockPong, CollectorAck, Dispatch, Heartbeat, RequestMsg,
                               RequestRow, Shutdown, Tokens, WorkerBye, WorkerHello, decode_all, encode, now)
from batchlab.protocol.messages import pack_tokens
from batchlab.scheduler.core import SchedulerCore
from tests.fault_plugins import OverCap
from tests.conftest import run_cli

DEADLINE_S = 60.0  # generous: every wait ends as soon as its condition holds
BEAT_S = 0.3
WORKER = "w0"
PROMPT = [1, 2, 3, 4]
LONG = 100_000  # output tokens of a batch that would run for about 15 minutes (9 ms a decode step)


def serve(scheduler_addr: str, collector_addr: str) -> None:
    """The worker process: a static sim worker of 4 rows (a100-llama2-7b: about 9 ms a decode step)."""
    from batchlab.worker.process import run_worker
    from batchlab.worker.sim import SimBackend

    raise SystemExit(run_worker(SimBackend("a100-llama2-7b", "static", 4), scheduler_addr, collector_addr, WORKER))


def row(batch_id: int, rid: int, output_len: int) -> RequestRow:
    return RequestRow(batch_id, RequestMsg(rid, 0.0, 0.0, len(PROMPT), output_len, pack_tokens(PROMPT)))


class FakeScheduler:
    """The worker's scheduler (ROUTER) and collector, played by the test; the worker runs in its own process."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="bl-", dir="/tmp")  # short ipc paths
        sched_addr, coll_addr = f"ipc://{self.folder}/s.sock", f"ipc://{self.folder}/c.sock"
        self.ctx = zmq.Context()
        self.router, self.collector = self.ctx.socket(zmq.ROUTER), self.ctx.socket(zmq.ROUTER)
        self.router.bind(sched_addr)
        self.collector.bind(coll_addr)
        self.seen: list[object] = []  # from the worker, to the scheduler
        self.recorded: list[object] = []  # from the worker, to the collector
        self.checked: dict[bool, int] = {}  # recorded? -> how many of its messages were waited for already
        self.last_beat = 0.0
        self.proc = mp.get_context("spawn").Process(target=serve, args=(sched_addr, coll_addr), daemon=True)
        self.proc.start()
        self.wait_for(lambda m: isinstance(m, WorkerHello))

    def send(self, msg: object) -> None:
        self.router.send_multipart([WORKER.encode(), encode(msg)])

    def dispatch(self, batch_id: int, rows: list[tuple[int, int]]) -> None:
        self.send(Dispatch(now(), "test", [row(batch_id, rid, n) for rid, n in rows]))

    def wait_for(self, cond: Callable[[object], bool], *, recorded: bool = False) -> object:
        """The first message (to the collector when `recorded`) not waited for before that satisfies `cond`;
        both sockets are read meanwhile (every message kept), the worker's pings answered and beats sent."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            kept = self.recorded if recorded else self.seen
            checked = self.checked.get(recorded, 0)
            match = next((i for i in range(checked, len(kept)) if cond(kept[i])), None)
            if match is not None:
                self.checked[recorded] = match + 1
                return kept[match]
            if time.monotonic() - self.last_beat > BEAT_S:
                self.send(Heartbeat("scheduler", now()))
                self.last_beat = time.monotonic()
            self.recorded += self._read(self.collector)
            for msg in self._read(self.router, timeout_ms=50):
                self.seen.append(msg)
                if isinstance(msg, ClockPing):
                    self.send(ClockPong(msg.seq, msg.t_send, now()))
        raise AssertionError(f"no match within {DEADLINE_S} s; last seen {self.seen[-3:]} {self.recorded[-3:]}")

    @staticmethod
    def _read(sock: zmq.Socket, timeout_ms: int = 0) -> list[object]:
        """The worker's messages on `sock`; at the collector's, its bye is acknowledged (it waits for that)."""
        out = []
        while sock.poll(timeout_ms):
            ident, frame = sock.recv_multipart()
            if ident == WORKER.encode():  # not the worker's heartbeat thread
                out += decode_all(frame)
            if any(isinstance(m, WorkerBye) for m in out):
                sock.send_multipart([ident, encode(CollectorAck("WorkerBye"))])
            timeout_ms = 0
        return out

    def mid_batch(self, rid: int) -> None:
        """Return once request `rid` has tokens at the collector (its batch runs)."""
        self.wait_for(lambda m: isinstance(m, Tokens) and rid in m.request_ids, recorded=True)

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(DEADLINE_S)
        self.router.close(linger=0)
        self.collector.close(linger=0)
        self.ctx.term()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def scheduler():
    fake = FakeScheduler()
    yield fake
    fake.close()


def batch_done(batch_id: int) -> Callable[[object], bool]:
    return lambda m: isinstance(m, BatchDone) and m.batch_id == batch_id


@pytest.mark.slow  # a worker process
def test_a_dispatch_sent_during_a_static_batch_runs_after_it(scheduler):
    scheduler.dispatch(0, [(1, 300)])  # about 3 s of decode steps
    scheduler.mid_batch(1)
    scheduler.dispatch(1, [(2, 3)])
    first = scheduler.wait_for(batch_done(0))
    second = scheduler.wait_for(batch_done(1))
    assert (first.finished, second.finished) == ([1], [2])


@pytest.mark.slow  # a worker process
def test_a_shutdown_sent_during_a_static_batch_stops_the_worker_and_fails_what_it_held(scheduler):
    scheduler.dispatch(0, [(1, LONG)])
    scheduler.mid_batch(1)
    scheduler.dispatch(1, [(2, 3), (3, 3)])  # kept for after the batch, then the Shutdown comes
    scheduler.send(Shutdown("test over"))
    running = scheduler.wait_for(batch_done(0))
    held = scheduler.wait_for(batch_done(1))
    assert running.finished == [] and [(r.request_id, r.reason) for r in running.failed] == [
        (1, "worker stopped before the batch finished")]
    assert held.finished == [] and [(r.request_id, r.reason) for r in held.failed] == [
        (2, "worker stopped before the request started"), (3, "worker stopped before the request started")]
    scheduler.wait_for(lambda m: isinstance(m, WorkerBye), recorded=True)
    scheduler.proc.join(DEADLINE_S)
    assert scheduler.proc.exitcode == 0  # the scheduler's Shutdown: a clean end, long before the batch's


# --- the scheduler's core never launches past a worker's free rows ------------------------------------
def hello(mode: str, rows: int = 4) -> WorkerHello:
    return WorkerHello(WORKER, "sim", "fake", mode, rows, 1, 10**12, "cpu", "none")


def request(rid: int) -> RequestMsg:
    return RequestMsg(rid, 0.0, 0.0, 4, 4)


def test_the_core_cuts_an_over_cap_launch_to_the_workers_free_rows_and_counts_it():
    core = SchedulerCore(OverCap())
    core.on_hello(WORKER, hello("static"), 0.0)
    for rid in range(10):
        core.on_request(request(rid), 0.0)
    first = core.schedule(0.0).launches  # idle: 4 rows, though it asked for all 10
    assert [r.request_id for r in first[0].requests] == [0, 1, 2, 3]
    assert core.schedule(0.1).launches == []  # busy: no free row
    assert [r.request_id for r in core.queue] == list(range(4, 10))  # the rest keep their order
    assert core.stats["launches_clamped"] == 2 and core.stats["rows_clamped"] == 6 + 6


def test_a_continuous_worker_gets_no_more_rows_than_it_has_free():
    core = SchedulerCore(OverCap())
    core.on_hello(WORKER, hello("continuous"), 0.0)
    for rid in range(3):
        core.on_request(request(rid), 0.0)
    core.schedule(0.0)
    for rid in range(3, 10):
        core.on_request(request(rid), 0.1)
    launched = core.schedule(0.1).launches
    assert [r.request_id for r in launched[0].requests] == [3]  # 4 rows, 3 running
    assert core.workers[WORKER].running == 4


@pytest.mark.slow  # a run's processes
def test_a_strategy_that_launches_past_the_free_rows_ends_with_every_request_terminal(tmp_path):
    proc = run_cli("run", "--backend", "sim", "--strategy", "tests.fault_plugins:OverCap", "--max-batch-size", "4",
                   "--rate", "20", "--duration", "2", "--max-new-tokens", "16", "--stall-limit-s", "10",
                   "--out", str(tmp_path), timeout_s=240)
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    schedule = pd.read_parquet(tmp_path / "schedule.parquet")
    assert proc.returncode == 0 and sorted(requests.request_id) == sorted(schedule.request_id)
    assert set(requests.status) == {"finished"}
