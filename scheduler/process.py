"""The scheduler process: the ZeroMQ edge around SchedulerCore (scheduler/core.py), which holds every
rule about requests; this file moves messages, reads the clock and watches liveness."""
import logging
import math
import time

import zmq

from batchlab.protocol import (Arrival, BatchDone, ClockPing, ClockPong, EndOfStream, Heartbeat, ProtocolError,
                               RequestMsg, RunEnd, RunInfo, Shutdown, Start, TrafficHello, WorkerCapacity, WorkerHello,
                               decode, encode, now)
from batchlab.protocol.security import start_authenticator
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S, HEARTBEAT_LIVENESS, make_socket
from batchlab.scheduler.core import Launch, SchedulerCore
from batchlab.scheduler.policies import Policy, QueuedRequest

log = logging.getLogger("batchlab.scheduler")
START_LEAD_S = 0.2  # planned time 0 lies this far after Start is sent, so the first sends are on time
MAX_MESSAGES_PER_POLL = 1_000  # then schedule and beat before reading on (a flood must not starve them)


class Scheduler:
    """Feeds the core what arrives and carries out its decisions."""

    def __init__(self, policy: Policy, scheduler_addr: str, collector_addr: str, *, min_workers: int = 1,
                 max_queue: int = 0, max_queue_tokens: int = 0, settings: dict | None = None,
                 keys: str | None = None, stream_ended=None) -> None:
        self.core = SchedulerCore(policy, max_queue=max_queue, max_queue_tokens=max_queue_tokens)
        self.min_workers = min_workers
        self.settings = dict(settings or {})
        self.stream_ended = stream_ended  # a multiprocessing.Event, or None
        self.ctx = zmq.Context()
        self.auth = start_authenticator(self.ctx, keys) if keys else None  # make_socket refuses a bare bind
        self.router = make_socket(self.ctx, zmq.ROUTER, scheduler_addr, bind=True, keys=keys)
        self.coll = make_socket(self.ctx, zmq.PUSH, collector_addr, bind=False, keys=keys)
        self.traffic: bytes | None = None
        self.t0: float | None = None
        self.stopping = False
        self.wake_at: float | None = None
        self.stats = {"rejected_messages": 0}  # the edge's own counters; the core keeps the rest
        self.last_beat = now()
        self.traffic_heard = now()

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until the stream ended and every request is terminal (or a signal)."""
        while not self.stopping:
            # 1. wait for a message, the core's wake-up time, or the next heartbeat
            for sender, msg in self._receive(self._timeout_ms()):
                # 2. feed it to the core (answer clock pings, start the traffic); forward what it decided
                self._handle(sender, msg)
                self._forward()
            # 3. the core launches batches on workers with room: send them
            self._schedule()
            # 4. liveness both ways (a silent worker is lost; the no-worker grace runs out)
            self._beat()
            self._forward()
            # 5. done?
            if self.core.done():
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
        wid, t = sender.decode(errors="replace"), now()
        if wid in self.core.workers:
            self.core.workers[wid].last_heard = t
        elif sender == self.traffic:
            self.traffic_heard = t
        if isinstance(msg, RequestMsg):
            self._to_collector(Arrival(msg.request_id, msg.arrival_time, msg.send_time, t, msg.prompt_len,
                                       msg.output_len))
            self.core.on_request(QueuedRequest(msg.request_id, msg.arrival_time, msg.prompt_len, msg.output_len,
                                               msg.prompt_tokens), t)
        elif isinstance(msg, BatchDone):
            self.core.on_batch_done(wid, msg.batch_id, msg.oom, t)
        elif isinstance(msg, WorkerHello):
            self._on_hello(wid, msg, t)
        elif isinstance(msg, WorkerCapacity):
            rows = self.core.on_capacity(wid, msg.max_rows)
            if rows is not None:
                log.info("worker %s now runs at most %d rows (%s)", wid, rows, msg.reason)
        elif isinstance(msg, TrafficHello):
            self.traffic = sender
            self._maybe_start()
        elif isinstance(msg, ClockPing):
            self.router.send_multipart([sender, encode(ClockPong(msg.seq, msg.t_send, now()))])
        elif isinstance(msg, Heartbeat) and msg.sender in self.core.workers:
            self.core.workers[msg.sender].last_heard = t
        elif isinstance(msg, EndOfStream):
            self.core.end_of_stream()
            self.stats["sent_by_traffic"] = msg.sent

    def _on_hello(self, wid: str, hello: WorkerHello, t: float) -> None:
        log.info("worker %s joined: %s %s (%s, max batch %d)", wid, hello.backend, hello.model, hello.mode,
                 hello.max_batch_size)
        lost = self.core.on_hello(wid, hello, t)
        if lost is not None:
            log.error("worker %s rejoined with %d request(s) in flight", wid, lost)
        self._maybe_start()

    def _maybe_start(self) -> None:
        if self.t0 is not None or self.traffic is None or len(self.core.workers) < self.min_workers:
            return
        self.t0 = now() + START_LEAD_S
        self.cpu_at_start = time.process_time()  # the run's CPU counts from here (not imports, not waiting)
        self._to_collector(RunInfo({**self.settings, "t0": self.t0, "workers": self.core.workers_info()}))
        self.router.send_multipart([self.traffic, encode(Start(self.t0))])
        self.traffic_heard = now()

    # --- scheduling -------------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Send what the core launches (nothing before traffic was told to start). A worker that a send
        cannot reach is lost, and the core is asked again: its requests need not wait for the next event."""
        self.wake_at = None
        while self.t0 is not None:
            decisions = self.core.schedule(now())
            self.wake_at = decisions.wake_at
            if self._send_all(decisions.launches):
                return

    def _send_all(self, launches: list[Launch]) -> bool:
        """Dispatch each launch and record it; False when a worker was unreachable (the core then took
        back its unsent launches and lost it)."""
        unsent: dict[str, list[Launch]] = {}
        for launch in launches:
            if launch.worker_id not in unsent:
                t = now()
                try:
                    self.router.send_multipart([launch.worker_id.encode(), encode(launch.dispatch(t))])
                    self._to_collector(launch.record(t))
                    continue
                except zmq.ZMQError as exc:  # the worker is gone (ROUTER_MANDATORY): nothing was sent
                    log.error("worker %s lost (unreachable: %s)", launch.worker_id, exc)
            unsent.setdefault(launch.worker_id, []).append(launch)
        for group in unsent.values():
            self.core.on_send_failed(group, now())
        return not unsent

    # --- liveness and the end ---------------------------------------------------------------------
    def _beat(self) -> None:
        t = now()
        if t - self.last_beat >= HEARTBEAT_INTERVAL_S:
            self.last_beat = t
            for wid in list(self.core.workers):
                self._send_worker(wid, Heartbeat("scheduler", t))
        limit_s = HEARTBEAT_LIVENESS * HEARTBEAT_INTERVAL_S
        for wid, state in list(self.core.workers.items()):
            if t - state.last_heard > limit_s:
                log.error("worker %s lost (silent for %.1f s)", wid, t - state.last_heard)
                self.core.on_worker_lost(wid, t)
        if self.t0 is not None and not self.core.eos and t - self.traffic_heard > limit_s:
            log.error("traffic silent for %.1f s: treating it as the end of the stream", t - self.traffic_heard)
            self.stats["traffic_lost"] = 1
            self.core.end_of_stream()
        if self.stream_ended is not None and self.stream_ended.is_set():
            self.core.end_of_stream()
        self.core.tick(t)

    def _send_worker(self, wid: str, msg: object) -> None:
        try:
            self.router.send_multipart([wid.encode(), encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError:  # unroutable (gone) or full: liveness will notice
            pass

    def _finish(self, why: str) -> None:
        self.core.fail_queue(f"scheduler stopped: {why}", now())  # only when interrupted: nothing may vanish
        self._forward()
        for wid in self.core.workers:
            self._send_worker(wid, Shutdown(why))
        if self.traffic is not None:
            try:
                self.router.send_multipart([self.traffic, encode(Shutdown(why))], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        cpu_s = time.process_time() - self.cpu_at_start if self.t0 is not None else 0.0  # from Start on
        stats = {**self.core.stats, **self.stats, "cpu_s": cpu_s}
        self._to_collector(RunEnd(self.core.stats["submitted"], list(self.core.workers), stats))

    def _forward(self) -> None:
        """The core's terminal records, to the collector."""
        for record in self.core.drain():
            self._to_collector(record)

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
