"""The worker process: owns a backend, runs what the scheduler dispatches, streams every step; one run
(run_worker), or run after run on one warm backend (serve_sessions)."""
import logging
import time
from dataclasses import dataclass

import zmq

from batchlab.protocol import (BatchDone, ClockPing, ClockPong, Dispatch, FailedRow, Shutdown, Step, WorkerBye,
                               WorkerCapacity, encode, now)
from batchlab.protocol.addresses import SCHEDULER_ID
from batchlab.protocol.environment import environment
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.clock_sync import RESYNC_INTERVAL_S, OffsetEstimate, measure
from batchlab.protocol.inbox import Inbox, wait_for_ack
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.sockets import (HEARTBEAT_INTERVAL_S, LINGER_MS, LIVENESS_S, RECORDS_HWM,
                                      RECORDS_SEND_TIMEOUT_MS, make_socket)
from batchlab.protocol.status import FailureKind, FailureReason, detailed
from batchlab.worker.admission import OpenBatch, admit
from batchlab.worker.backend import Backend, OutOfMemory, BackendRequest, StepOutput, worker_hello
from batchlab.worker.outbox import HeartbeatThread, Outbox

log = logging.getLogger("batchlab.worker")
WAITING_LOG_INTERVAL_S = 30.0  # before the scheduler first answers, say so this often


class WorkerStopping(Exception):
    """Raised from a step callback to abandon a static batch when the worker must stop."""


class Worker:
    """Socket edges around a backend: hello, dispatches in, tokens and batch results out."""

    def __init__(self, backend: Backend, scheduler_addr: str, collector_addr: str, worker_id: str,
                 keys: str | None = None, run_over=None, liveness_s: float = LIVENESS_S) -> None:
        self.backend, self.worker_id = backend, worker_id
        self.liveness_s, self.exit_code = liveness_s, 0  # a scheduler silent this long is gone; run_worker's code
        self.run_over = run_over  # a warm worker's "the run I wait for has ended" (its launcher moved on)
        self.ctx = zmq.Context()
        self.sched = make_socket(self.ctx, zmq.DEALER, scheduler_addr, bind=False, identity=worker_id, keys=keys)
        self.coll = make_socket(self.ctx, zmq.DEALER, collector_addr, bind=False, identity=worker_id, keys=keys,
                                hwm=RECORDS_HWM, send_timeout_ms=RECORDS_SEND_TIMEOUT_MS)  # a collector behind
        # slows us (a send waits, looking at our stop every RECORDS_SEND_TIMEOUT_MS) rather than growing our memory
        self.collector = Inbox(self.coll, log, peer="collector")  # its answer to our bye
        self.inbox = Inbox(self.sched, log, peer=SCHEDULER_ID)  # counts rejected_messages (refused rows too)
        self.open: dict[int, OpenBatch] = {}  # batch_id -> continuous bookkeeping
        self.batch_of: dict[int, int] = {}  # request_id -> batch_id (continuous)
        self.step_no = 0
        self.max_rows = backend.info.max_batch_size  # the row cap the scheduler last heard (hello, then reports)
        self.stopping = False
        self.signalled = False  # a stop signal came (stop_on_signal)
        self.cpu_start_s = time.process_time()  # this run's share of a warm worker's CPU
        self.waiting_logged_s = now()  # the last "still waiting" line, before the scheduler is first heard
        self.deferred: list[object] = []
        self.heart = HeartbeatThread(self.ctx, scheduler_addr, worker_id, keys)
        self.clock = OffsetEstimate()
        self.out = Outbox(self.sched, self.coll, self.clock.to_scheduler, keep_trying=lambda: not self.signalled)
        self.next_sync = 0.0

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Say hello to this run's scheduler (the backend is warm), then serve until Shutdown, a signal,
        or a silent scheduler."""
        self.heart.start()
        self.deferred.extend(measure(self.inbox, self.clock, stopping=lambda: self.stopping or self._abandoned()))
        self._hello()
        self._report_capacity()  # a warm-up OOM may already have lowered the cap the hello announced
        while not self.stopping:
            busy = self.backend.info.mode == BatchingMode.CONTINUOUS and self.backend.has_work()
            # 1. take what the scheduler sent (do not block while a continuous batch runs)
            msgs = self._receive(timeout_ms=0 if busy else int(HEARTBEAT_INTERVAL_S * 1000))
            for i, msg in enumerate(msgs):
                if self.stopping:  # a Shutdown (or a signal) came first: what is left fails at close()
                    self.deferred[:0] = msgs[i:]
                    break
                self._handle(msg)
            # 2. advance the continuous batch by one step
            if busy:
                self._continuous_step()
            # 3. what this pass produced: BatchDones now, the collector's records when due or before a wait
            self.out.flush(all_records=not busy or not self.backend.has_work())
            # 4. keep the clock offset fresh
            self._resync()

    def close(self, close_backend: bool = True) -> None:
        """Fail what is still running, say goodbye to the collector, then close sockets and context
        (and the backend, unless it stays warm for the next run)."""
        for rid in list(self.batch_of):  # continuous rows cut off by a stop: terminal, never silent
            self._close_row(rid, FailureReason.UNFINISHED)
        self._fail_deferred(FailureReason.NOT_STARTED)
        try:
            stats = {**self.inbox.counters, "cpu_s": time.process_time() - self.cpu_start_s,
                     "records_send_s": self.out.records.send_s,  # waiting on a collector behind: it slowed us
                     **self.clock.facts(), **self.backend.run_facts()}
            self.out.record(WorkerBye(self.worker_id, self.backend.peak_memory_bytes(),
                                         self.backend.info.memory_kind, stats))
            self.out.flush()
            self._wait_for_collector()
        finally:
            self.heart.stop()
            if close_backend:
                self.backend.close()
            self.sched.close()
            self.coll.close()
            self.ctx.term()

    # --- steps ------------------------------------------------------------------------------------
    def _hello(self) -> None:
        hello = worker_hello(self.worker_id, self.backend.info,
                             {**self.clock.facts(), "environment": environment()})  # this box's, not the launcher's
        self.sched.send(encode(hello))
        self.out.record(hello)
        self.out.flush()

    def _receive(self, timeout_ms: int) -> list[object]:
        msgs, self.deferred = self.deferred, []
        new = [msg for _, msg in self.inbox.receive(timeout_ms)]
        if timeout_ms and not new:
            self._check_scheduler_alive()
        return msgs + new

    def _take_mid_batch(self) -> None:
        """During a static batch: keep what arrives, in order, for the loop's next pass (a Dispatch then runs
        after this batch); a Shutdown among it stops the worker now."""
        for _, msg in self.inbox.receive(0):
            self.deferred.append(msg)
            if isinstance(msg, Shutdown):
                log.info("shutdown during a batch: %s", msg.reason)
                self.stopping = True

    def _fail_deferred(self, reason: str) -> None:
        """Dispatches kept for later that never ran (the worker stopped first): each row fails with `reason`."""
        for msg in self.deferred:
            if isinstance(msg, Dispatch):
                t = now()
                for batch_id in dict.fromkeys(row.batch_id for row in msg.requests):
                    failed = [FailedRow(r.request.request_id, reason) for r in msg.requests if r.batch_id == batch_id]
                    self._batch_done(BatchDone(batch_id, self.worker_id, t, t, [], failed, False,
                                               self.backend.peak_memory_bytes()))
        self.deferred = []

    def _handle(self, msg: object) -> None:
        if isinstance(msg, Dispatch):
            admission = admit(msg, self.worker_id, self.backend.info, self.open, self.batch_of)
            for why in admission.refused:
                self.inbox.reject(why)
            for done in admission.answers:  # refused: each row fails with the reason
                self._batch_done(done)
            for batch_id, requests in admission.accepted:  # a static pass's one batch, or a continuous one's
                rows = [BackendRequest.of(r) for r in requests]
                if self.backend.info.mode == BatchingMode.CONTINUOUS:
                    self._admit(batch_id, rows)
                else:
                    self._run_static(batch_id, rows)
        elif isinstance(msg, ClockPong):
            self.clock.add(msg.t_send, msg.t_server, now())
        elif isinstance(msg, Shutdown):
            log.info("shutdown: %s", msg.reason)
            self.stopping = True

    def _run_static(self, batch_id: int, rows: list[BackendRequest]) -> None:
        start, finished, failed, oom = now(), [], [], False
        batch_of = {r.request_id: batch_id for r in rows}

        def on_step(out: StepOutput) -> None:
            self.out.tokens(self.step_no, out, batch_of)
            self.out.flush(all_records=False)
            finished.extend(out.finished)
            self._take_mid_batch()
            if self.stopping:  # a signal or Shutdown: abandon the batch (generate() ends by this raise)
                raise WorkerStopping(FailureReason.STOPPED)

        try:
            self.backend.run_batch(rows, on_step)
        except OutOfMemory:
            oom = True
        except Exception as exc:  # a stop, or a backend failure: it fails this batch, never the worker
            reason = FailureReason.STOPPED
            if not isinstance(exc, WorkerStopping):
                log.exception("batch %d failed", batch_id)
                reason = detailed(FailureKind.WORKER_ERROR, f"{type(exc).__name__}: {exc}")
            done = set(finished)
            failed = [FailedRow(r.request_id, reason) for r in rows if r.request_id not in done]
        self._batch_done(BatchDone(batch_id, self.worker_id, start, now(), [] if oom else finished, failed,
                                   oom, self.backend.peak_memory_bytes()))
        self.out.flush()

    def _admit(self, batch_id: int, rows: list[BackendRequest]) -> None:
        self.open[batch_id] = OpenBatch({r.request_id for r in rows}, now())
        self.batch_of.update((r.request_id, batch_id) for r in rows)
        self.backend.admit(rows)

    def _continuous_step(self) -> None:
        try:
            out = self.backend.step()
        except Exception as exc:
            out = None
            self._fail_step(exc)
        self._report_capacity()  # an OOM inside the step may have moved the backend's row cap
        if out is None:
            return
        self.out.tokens(self.step_no, out, self.batch_of)  # one step serves many batches
        conv = self.clock.to_scheduler
        self.out.record(Step(self.worker_id, self.step_no, conv(out.start_time), conv(out.time), out.running,
                                out.joined, len(out.finished), out.prefill_tokens, out.prefill_rows,
                                out.prefill_width, out.prefill_pairs))
        self.step_no += 1
        for rid in out.finished:
            self._close_row(rid, None)
        for rid, reason in out.failed:
            self._close_row(rid, reason)

    def _fail_step(self, exc: Exception) -> None:
        """A step that raised fails every row once; the backend drops them, or the next step would repeat it."""
        log.exception("continuous step failed")
        try:
            self.backend.abort_all()
        except Exception:  # the rows fail below either way
            log.exception("aborting the backend's rows failed")
        reason = detailed(FailureKind.WORKER_ERROR, f"{type(exc).__name__}: {exc}")
        for rid in list(self.batch_of):
            self._close_row(rid, reason)

    def _report_capacity(self) -> None:
        """Tell the scheduler when the backend's row cap moved, so its credit follows."""
        if self.backend.max_rows != self.max_rows:
            self.max_rows = self.backend.max_rows
            self.sched.send(encode(WorkerCapacity(self.worker_id, self.max_rows, self.backend.max_rows_reason)))

    def _close_row(self, request_id: int, reason: str | None) -> None:
        batch_id = self.batch_of.pop(request_id, None)
        if batch_id is None:
            return
        ob = self.open[batch_id]
        ob.left.discard(request_id)
        if reason is None:
            ob.finished.append(request_id)
        else:
            ob.failed.append(FailedRow(request_id, reason))
        if not ob.left:
            del self.open[batch_id]
            self._batch_done(BatchDone(batch_id, self.worker_id, ob.start_time, now(), ob.finished, ob.failed,
                                       False, self.backend.peak_memory_bytes()))

    def _batch_done(self, done: BatchDone) -> None:
        """A batch's end, on the scheduler's clock, with the engine's own stamps of its requests (vLLM): per-request
        engine metrics travel with each completion, so no message grows with the run."""
        conv = self.clock.to_scheduler
        metrics = self.backend.take_metrics([*done.finished, *(row.request_id for row in done.failed)])
        done.engine_metrics = {str(rid): {k: conv(v) if k.endswith("_ts") else v for k, v in m.items()}
                               for rid, m in metrics.items()}
        done.start_time = conv(done.start_time)
        done.end_time = conv(done.end_time)
        self.out.done(done)

    def _resync(self) -> None:
        t = now()
        if t >= self.next_sync:
            self.next_sync = t + RESYNC_INTERVAL_S
            self.sched.send(encode(ClockPing(-1, t)))

    def _wait_for_collector(self) -> None:
        """Keep the socket to the collector until it took our bye (and so every record before it), up to the
        liveness window after the scheduler's Shutdown; after a signal or a silent scheduler the socket's usual
        linger (the run is being stopped, or broken)."""
        signalled = self.signalled
        wait_s = self.liveness_s if self.exit_code == 0 and not signalled else LINGER_MS / 1000
        if not wait_for_ack(self.collector, "WorkerBye", wait_s, lambda: self.signalled != signalled):
            log.warning("the collector did not take this worker's bye within %.1f s: records still queued may be "
                        "lost", wait_s)

    def _check_scheduler_alive(self) -> None:
        """Called after a poll that heard nothing; our own heartbeats go from a thread (outbox.HeartbeatThread)."""
        t = now()
        if SCHEDULER_ID not in self.inbox.heard:  # a scheduler that is not up yet gets our hello when it binds
            if self._abandoned():
                log.warning("the run ended before its scheduler was heard: leaving it")
                self.stopping = True
            elif t - self.waiting_logged_s > WAITING_LOG_INTERVAL_S:
                log.warning("no word from the scheduler yet; still waiting")
                self.waiting_logged_s = t
            return
        silent_s = self.inbox.silent_s(SCHEDULER_ID, t)
        if silent_s > self.liveness_s:
            log.error("scheduler silent for %.1f s: stopping", silent_s)
            self.stopping, self.exit_code = True, 1

    def stop_on_signal(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop after the current step (or the wait for the collector's ack); the exit code
        says which signal."""
        self.stopping, self.signalled, self.exit_code = True, True, 128 + signum

    def _abandoned(self) -> bool:
        """A warm worker whose run ended before its scheduler was ever heard (it never came up)."""
        return self.run_over is not None and SCHEDULER_ID not in self.inbox.heard and self.run_over()


def run_worker(backend: Backend, scheduler_addr: str, collector_addr: str, worker_id: str = "worker-0",
               keys: str | None = None, liveness_s: float = LIVENESS_S) -> int:
    """Warm up, then serve one run until told to stop; SIGINT/SIGTERM stop after the current step. Exit
    code: 0 after the scheduler's Shutdown, 128 + the signal after one, 1 when the scheduler went silent."""
    worker = Worker(backend, scheduler_addr, collector_addr, worker_id, keys, liveness_s=liveness_s)
    with on_stop_signal(worker.stop_on_signal):
        try:
            backend.warmup()
            worker.run()
        finally:
            worker.close()
    return worker.exit_code


@dataclass(slots=True)
class Session:
    """One run that a warm worker joins: where its scheduler and collector listen, and its folder."""

    scheduler_addr: str
    collector_addr: str
    out_dir: str


def serve_sessions(make_backend, next_session, worker_id: str, keys: str | None = None,
                   on_session=None, run_over=None) -> int:
    """A warm worker: build and warm the backend once, then join run after run (a sweep's points that share its
    settings; see runner/pool.py), each a `Session` that a Worker serves.

    `next_session(timeout_s)` returns the next Session, None to end, or raises queue.Empty; between
    runs the backend is reset (`reset()`: no rows, no cached prefixes, fresh peak memory), so no run
    inherits another's state. `on_session(session)` runs first in each (per-run logs); `run_over()` says
    the launcher has moved on (a run whose scheduler never came up is then left). SIGINT/SIGTERM end
    the current run after its step, then the process.
    """
    import queue

    state: dict = {"exit": False, "worker": None}

    def on_signal(_signum: int) -> None:
        state["exit"] = True
        if state["worker"] is not None:
            state["worker"].stopping = state["worker"].signalled = True

    with on_stop_signal(on_signal):
        started = now()
        backend = make_backend()
        try:
            backend.warmup()
            backend.info.facts["startup_s"] = round(now() - started, 3)  # load + warm-up, once
            runs = 0
            while not state["exit"]:
                try:
                    session = next_session(0.5)
                except queue.Empty:
                    continue
                if session is None:
                    break
                if on_session is not None:
                    on_session(session)
                if runs:
                    backend.reset()
                backend.info.facts["warm_runs_before"] = runs  # 0: this run paid the start-up
                state["worker"] = Worker(backend, session.scheduler_addr, session.collector_addr, worker_id,
                                         keys, run_over)
                try:
                    state["worker"].run()
                finally:
                    state["worker"].close(close_backend=False)
                    state["worker"] = None
                runs += 1
        finally:
            backend.close()
    return 0
