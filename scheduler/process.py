"""The scheduler process: queue in, batches out; the policy decides, this file only moves messages."""
import itertools
import logging
import math

import zmq

from batchlab.protocol import (Arrival, BatchDone, BatchLaunch, ClockPing, ClockPong, Dispatch, EndOfStream, Heartbeat,
                      ProtocolError, RequestFailed, RequestMsg, RunEnd, RunInfo, Shutdown, Start, TrafficHello,
                      WorkerCapacity, WorkerHello, decode, encode, now)
from batchlab.protocol.security import start_authenticator
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S, HEARTBEAT_LIVENESS, make_socket
from batchlab.scheduler.policies import Policy
from batchlab.scheduler.workers import Pending, PendingQueue, WorkerState, least_loaded

log = logging.getLogger("batchlab.scheduler")
START_LEAD_S = 0.2  # planned time 0 lies this far after Start is sent, so the first sends are on time
MAX_LOSSES = 1  # a request lost with its worker is requeued this often, then failed
WORKER_REJOIN_GRACE_S = 10.0  # with no worker left, queued requests wait this long for one to (re)join
MAX_MESSAGES_PER_POLL = 1_000  # then schedule and beat before reading on (a flood must not starve them)


class Scheduler:
    """Feeds the policy and carries out its decisions."""

    def __init__(self, policy: Policy, scheduler_addr: str, collector_addr: str, *, min_workers: int = 1,
                 max_queue: int = 0, max_queue_tokens: int = 0, settings: dict | None = None,
                 keys: str | None = None, stream_ended=None) -> None:
        self.policy, self.min_workers = policy, min_workers
        self.max_queue, self.max_queue_tokens = max_queue, max_queue_tokens
        self.settings = dict(settings or {})
        self.stream_ended = stream_ended  # a multiprocessing.Event, or None
        self.ctx = zmq.Context()
        self.auth = start_authenticator(self.ctx, keys) if keys else None  # make_socket refuses a bare bind
        self.router = make_socket(self.ctx, zmq.ROUTER, scheduler_addr, bind=True, keys=keys)
        self.coll = make_socket(self.ctx, zmq.PUSH, collector_addr, bind=False, keys=keys)
        self.workers: dict[str, WorkerState] = {}
        self.queue = PendingQueue()
        self.traffic: bytes | None = None
        self.t0: float | None = None
        self.eos = self.stopping = False
        self.next_batch_id = 0
        self.wake_at: float | None = None
        self.stats = {"submitted": 0, "rejected_messages": 0, "queue_full": 0, "oom_batches": 0,
                      "workers_lost": 0, "workers_rejoined": 0, "capacity_changes": 0, "max_queue_len": 0}
        self.last_beat = now()
        self.traffic_heard = now()
        self.orphaned_since: float | None = None  # when the last worker was lost

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until the stream ended and every request is terminal (or a signal)."""
        while not self.stopping:
            # 1. wait for a message, the policy's wake-up time, or the next heartbeat
            for sender, msg in self._receive(self._timeout_ms()):
                self._handle(sender, msg)
            # 2. let the policy launch batches on workers with room
            self._schedule()
            # 3. liveness both ways
            self._beat()
            if self.stream_ended is not None and self.stream_ended.is_set():
                self.eos = True
            # 4. done?
            if self.eos and not self.queue and not any(w.inflight for w in self.workers.values()):
                break
        self._finish("run complete" if not self.stopping else "interrupted")

    def _timeout_ms(self) -> int:
        limit = HEARTBEAT_INTERVAL_S
        if self.wake_at is not None:
            limit = min(limit, max(0.0, self.wake_at - now()))
        return math.ceil(limit * 1000)

    def _receive(self, timeout_ms: int) -> list[tuple[bytes, object]]:
        out = []
        if not self.router.poll(timeout_ms):
            return out
        recv = self.router.recv_multipart
        for _ in range(MAX_MESSAGES_PER_POLL):
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                if len(frames) != 2:
                    raise ProtocolError(f"expected [identity, message], got {len(frames)} frames")
                out.append((frames[0], decode(frames[1])))
            except ProtocolError as exc:
                self.stats["rejected_messages"] += 1
                if self.stats["rejected_messages"] <= 10:
                    log.warning("rejected a message: %s", exc)
        return out

    # --- message handlers -------------------------------------------------------------------------
    def _handle(self, sender: bytes, msg: object) -> None:
        wid = sender.decode(errors="replace")
        if wid in self.workers:
            self.workers[wid].last_heard = now()
        elif sender == self.traffic:
            self.traffic_heard = now()
        if isinstance(msg, RequestMsg):
            self._on_request(msg)
        elif isinstance(msg, BatchDone):
            self._on_batch_done(wid, msg)
        elif isinstance(msg, WorkerHello):
            self._on_hello(wid, msg)
        elif isinstance(msg, WorkerCapacity):
            self._on_capacity(wid, msg)
        elif isinstance(msg, TrafficHello):
            self.traffic = sender
            self._maybe_start()
        elif isinstance(msg, ClockPing):
            self.router.send_multipart([sender, encode(ClockPong(msg.seq, msg.t_send, now()))])
        elif isinstance(msg, Heartbeat) and msg.sender in self.workers:
            self.workers[msg.sender].last_heard = now()
        elif isinstance(msg, EndOfStream):
            self.eos = True
            self.stats["sent_by_traffic"] = msg.sent

    def _on_hello(self, wid: str, hello: WorkerHello) -> None:
        log.info("worker %s joined: %s %s (%s, max batch %d)", wid, hello.backend, hello.model, hello.mode,
                 hello.max_batch_size)
        old = self.workers.get(wid)
        if old is not None:  # a restarted worker: what its last process ran is gone with it
            self.stats["workers_rejoined"] += 1
            log.error("worker %s rejoined with %d request(s) in flight", wid, old.running)
            self._drop_inflight(old, "worker rejoined: its running requests were lost")
        self.workers[wid] = WorkerState(hello, now())
        self.orphaned_since = None
        self._maybe_start()

    def _on_capacity(self, wid: str, msg: WorkerCapacity) -> None:
        """The worker's row cap moved (OOM back-off or probe): its credit follows from the next decision."""
        state = self.workers.get(wid)
        if state is None:
            return
        self.stats["capacity_changes"] += 1
        rows = state.set_max_rows(msg.max_rows)
        log.info("worker %s now runs at most %d rows (%s)", wid, rows, msg.reason)

    def _maybe_start(self) -> None:
        if self.t0 is not None or self.traffic is None or len(self.workers) < self.min_workers:
            return
        self.t0 = now() + START_LEAD_S
        hellos = {w: {**s.hello.facts, "backend": s.hello.backend, "model": s.hello.model, "mode": s.hello.mode,
                      "device": s.hello.device, "max_batch_size": s.hello.max_batch_size,
                      "kv_budget_bytes": s.hello.kv_budget_bytes, "kv_bytes_per_token": s.hello.kv_bytes_per_token,
                      "memory_kind": s.hello.memory_kind} for w, s in self.workers.items()}
        self._to_collector(RunInfo({**self.settings, "t0": self.t0, "workers": hellos}))
        self.router.send_multipart([self.traffic, encode(Start(self.t0))])
        self.traffic_heard = now()

    def _on_request(self, msg: RequestMsg) -> None:
        self.stats["submitted"] += 1
        self._to_collector(Arrival(msg.request_id, msg.arrival_time, msg.send_time, now(), msg.prompt_len,
                                   msg.output_len))
        if self.queue.is_full_for(msg.prompt_len + msg.output_len, self.max_queue, self.max_queue_tokens):
            self.stats["queue_full"] += 1
            self._to_collector(RequestFailed(msg.request_id, "queue full", now()))
            return
        if self.orphaned_since is not None and now() - self.orphaned_since > WORKER_REJOIN_GRACE_S:
            self._to_collector(RequestFailed(msg.request_id, "worker lost: no worker left", now()))
            return
        self.queue.append(Pending(msg.request_id, msg.arrival_time, msg.prompt_len, msg.output_len,
                                  msg.prompt_tokens))
        self.stats["max_queue_len"] = max(self.stats["max_queue_len"], len(self.queue))

    def _on_batch_done(self, wid: str, done: BatchDone) -> None:
        state = self.workers.get(wid)
        batch = state.end(done.batch_id) if state else None
        if batch is None:
            return
        state.batches_done += 1
        self.policy.on_batch_done(len(batch), done.oom)
        if done.oom:
            self.stats["oom_batches"] += 1
            if len(batch) == 1:  # it does not fit even alone: retrying cannot help
                self._to_collector(RequestFailed(batch[0].request_id, "out of memory: does not fit alone", now()))
                return
            for p in reversed(batch):  # back to the front, in their order; the policy's cap has halved
                self.queue.appendleft(p)

    # --- scheduling -------------------------------------------------------------------------------
    def _schedule(self) -> None:
        self.wake_at = None
        if self.t0 is None:
            return
        for wid in least_loaded(self.workers) if len(self.workers) > 1 else list(self.workers):
            if not self.queue:
                return
            state = self.workers[wid]
            # Pending has every QueuedRequest field a policy reads: no per-loop copies of the queue head
            decision = self.policy.decide(self._head(state), now(), state.capacity(), self.eos)
            if decision.n:
                self._launch(wid, [self.queue.popleft() for _ in range(decision.n)], decision.reason)
            elif decision.wake_at is not None:
                self.wake_at = decision.wake_at if self.wake_at is None else min(self.wake_at, decision.wake_at)

    def _head(self, state: WorkerState) -> list[Pending]:
        """The part of the queue a decision can use (no more than the worker could take)."""
        return list(itertools.islice(self.queue, max(state.max_rows, 1)))  # deque[i] is O(i)

    def _launch(self, wid: str, batch: list[Pending], reason: str) -> None:
        state = self.workers[wid]
        groups = [[p] for p in batch] if state.hello.mode == "continuous" else [batch]
        for i, group in enumerate(groups):
            t = now()
            dispatch = Dispatch(self.next_batch_id, t, reason, [p.row() for p in group])
            try:
                self.router.send_multipart([wid.encode(), encode(dispatch)])
            except zmq.ZMQError as exc:  # the worker is gone (ROUTER_MANDATORY): nothing was sent
                for p in reversed([p for g in groups[i:] for p in g]):
                    self.queue.appendleft(p)
                self._lose_worker(wid, f"unreachable: {exc}")
                return
            self.next_batch_id += 1
            state.start(dispatch.batch_id, group)
            self._to_collector(BatchLaunch(dispatch.batch_id, wid, t, reason, [p.request_id for p in group],
                                           len(self.queue)))

    # --- liveness and the end ---------------------------------------------------------------------
    def _beat(self) -> None:
        t = now()
        if t - self.last_beat >= HEARTBEAT_INTERVAL_S:
            self.last_beat = t
            for wid in list(self.workers):
                self._send_worker(wid, Heartbeat("scheduler", t))
        limit_s = HEARTBEAT_LIVENESS * HEARTBEAT_INTERVAL_S
        for wid, state in list(self.workers.items()):
            if t - state.last_heard > limit_s:
                self._lose_worker(wid, f"silent for {t - state.last_heard:.1f} s")
        if self.t0 is not None and not self.eos and t - self.traffic_heard > limit_s:
            log.error("traffic silent for %.1f s: treating it as the end of the stream", t - self.traffic_heard)
            self.stats["traffic_lost"] = 1
            self.eos = True
        if self.orphaned_since is not None and t - self.orphaned_since > WORKER_REJOIN_GRACE_S:
            self._fail_queue("worker lost: no worker left")

    def _fail_queue(self, reason: str) -> None:
        """Every queued request becomes a terminal failure (nothing may vanish)."""
        while self.queue:
            self._to_collector(RequestFailed(self.queue.popleft().request_id, reason, now()))

    def _lose_worker(self, wid: str, why: str) -> None:
        log.error("worker %s lost (%s)", wid, why)
        self.stats["workers_lost"] += 1
        state = self.workers.pop(wid)
        if not self.workers:
            self.orphaned_since = now()
        self._drop_inflight(state, f"worker lost: {wid}")

    def _drop_inflight(self, state: WorkerState, reason: str) -> None:
        """A worker's in-flight requests went with it: each is requeued once, then failed with `reason`."""
        lost = [p for batch in state.inflight.values() for p in batch]
        for p in reversed(lost):
            p.losses += 1
            if p.losses <= MAX_LOSSES:
                self.queue.appendleft(p)  # a live worker, or one that rejoins within the grace
            else:
                self._to_collector(RequestFailed(p.request_id, reason, now()))

    def _send_worker(self, wid: str, msg: object) -> None:
        try:
            self.router.send_multipart([wid.encode(), encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError:  # unroutable (gone) or full: liveness will notice
            pass

    def _finish(self, why: str) -> None:
        self._fail_queue(f"scheduler stopped: {why}")  # only when interrupted: nothing may vanish
        for wid in self.workers:
            self._send_worker(wid, Shutdown(why))
        if self.traffic is not None:
            try:
                self.router.send_multipart([self.traffic, encode(Shutdown(why))], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        self._to_collector(RunEnd(self.stats["submitted"], list(self.workers), dict(self.stats)))

    def _to_collector(self, msg: object) -> None:
        self.coll.send(encode(msg))

    def close(self) -> None:
        """Sockets first, then the context."""
        self.router.close()
        self.coll.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def run_scheduler(policy: Policy, scheduler_addr: str, collector_addr: str, **kwargs) -> int:
    """Run the scheduler until the run ends; SIGINT/SIGTERM end it early, cleanly. A set
    `stream_ended` event (the launcher saw traffic die) ends the stream: what arrived is still served."""
    sched = Scheduler(policy, scheduler_addr, collector_addr, **kwargs)
    with on_stop_signal(lambda _signum: setattr(sched, "stopping", True)):
        try:
            sched.run()
        finally:
            sched.close()
    return 0
