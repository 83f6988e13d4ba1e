"""The scheduler process: the ZeroMQ edge around SchedulerCore (scheduler/core.py), which holds every
rule about requests; this file moves messages, reads the clock and watches liveness.

Its gate (scheduler/gate.py: TrafficGate) says who may submit requests, and which: the traffic that announced
the run's schedule (the first TrafficHello, bound for the run), until the stream's end, and of its requests only
those its schedule plans, when planned. On loopback without keys any local process can connect to the
scheduler's socket; its messages are refused there, so a forged request never becomes a row nor takes a real
request's id.
"""
import contextlib
import dataclasses
import logging
import math
import time

import zmq

from batchlab.protocol import (Arrival, BatchDone, ClockPing, ClockPong, EndOfStream, EndOfStreamAck, Heartbeat,
                               RequestMsg, RequestsEnded, RunEnd, RunInfo, Shutdown, Start, TrafficHello,
                               WorkerCapacity, WorkerHello, encode, now)
from batchlab.protocol.addresses import COLLECTOR_ID, SCHEDULER_ID
from batchlab.protocol.inbox import Inbox, RateLimitedLog, wait_for_ack
from batchlab.protocol.security import start_authenticator
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.status import FailureKind, detailed
from batchlab.protocol.sockets import (HEARTBEAT_INTERVAL_S, LINGER_MS, LIVENESS_S, RECORDS_HWM,
                                      RECORDS_SEND_TIMEOUT_MS, Bundler, make_socket, send_routed)
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.gate import PlannedSchedule, TrafficGate
from batchlab.scheduler.launch import Launch
from batchlab.scheduler.policies import Policy

log = logging.getLogger("batchlab.scheduler")
START_LEAD_S = 0.2  # planned time 0 lies this far after Start is sent, so the first sends are on time
MAX_MESSAGES_PER_POLL = 1_000  # then schedule and beat before reading on (a flood must not starve them)
# The collector's records (Arrival, BatchLaunch, ...) go in one frame per interval, not one per request:
# their times travel inside them, and a frame costs both processes' I/O threads more than its contents.
RECORD_FLUSH_INTERVAL_S = 0.002  # below the workers' 5 ms: a launch mostly reaches the collector before its tokens


class Scheduler:
    """Feeds the core what arrives and carries out its decisions."""

    def __init__(self, policy: Policy, scheduler_addr: str, collector_addr: str, *, min_workers: int = 1,
                 max_queue: int = 0, max_queue_tokens: int = 0, settings: dict | None = None,
                 keys: str | None = None, stream_ended=None, liveness_s: float = LIVENESS_S,
                 stall_limit_s: float = 0.0, workers_ended=None, planned: PlannedSchedule | None = None) -> None:
        self.core = SchedulerCore(policy, max_queue=max_queue, max_queue_tokens=max_queue_tokens,
                                  stall_limit_s=stall_limit_s)
        self.liveness_s = liveness_s  # a worker or the traffic silent this long is lost
        self.stop_signal = 0  # the signal that stopped the run early (0: none)
        self.silent: dict[str, WorkerHello] = {}  # workers lost for their silence, by id: they may come back
        self.min_workers = min_workers
        self.workers_ended = workers_ended  # a multiprocessing Value: the launcher's count of workers that ended
        self.settings = dict(settings or {})
        self.stream_ended = stream_ended  # a multiprocessing.Event, or None
        self.ctx = zmq.Context()
        self.auth = start_authenticator(self.ctx, keys) if keys else None  # make_socket refuses a bare bind
        self.router = make_socket(self.ctx, zmq.ROUTER, scheduler_addr, bind=True, keys=keys)
        self.coll = make_socket(self.ctx, zmq.DEALER, collector_addr, bind=False, identity=SCHEDULER_ID, keys=keys,
                                hwm=RECORDS_HWM, send_timeout_ms=RECORDS_SEND_TIMEOUT_MS)  # a collector behind
        # slows us (a send waits, looking at our stop every RECORDS_SEND_TIMEOUT_MS) rather than growing our memory
        self.traffic: bytes | None = None
        self.closed_loop = False  # the traffic's hello gave a concurrency: it is told which requests ended
        self.ended: list[int] = []  # closed loop: requests ended since the traffic was last told
        self.t0: float | None = None
        self.stopping = False
        self.wake_at: float | None = None
        self.stats: dict = {}  # the edge's own counters (rejected_messages: the inbox's); the core keeps the rest
        self.inbox = Inbox(self.router, log, counters=self.stats, max_frames=MAX_MESSAGES_PER_POLL)
        self.collector = Inbox(self.coll, log, peer=COLLECTOR_ID, counters=self.stats)  # its answers
        self.poller = zmq.Poller()
        for sock in (self.router, self.coll):
            self.poller.register(sock, zmq.POLLIN)
        self.duplicates = RateLimitedLog(log)  # the core counts them (duplicate_requests)
        self.gate = TrafficGate(planned)  # the announced traffic, and what its schedule plans
        self.refusals = RateLimitedLog(log)  # the gate counts them (refused_requests, refused_stream_messages)
        self.clamps = RateLimitedLog(log)  # the core counts them (launches_clamped, rows_clamped)
        self.last_beat = now()
        self.records = Bundler(self.coll, RECORD_FLUSH_INTERVAL_S,  # the collector's records not yet sent
                               keep_trying=lambda: not self.stop_signal)
        self._beat_collector()  # the traffic starts once the collector answered (a stopped one holds the start)

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until the stream ended and every request is terminal (or a signal)."""
        while not self.stopping:
            # 1. wait for a message, the core's wake-up time, or the next heartbeat (the collector's answers too)
            ready = dict(self.poller.poll(self._timeout_ms()))
            if self.coll in ready:
                self._collector_heard()
            for sender, msg in self.inbox.drain() if self.router in ready else ():
                # 2. feed it to the core (answer clock pings, start the traffic); forward what it decided
                self._handle(sender, msg)
                self._forward()
            # 3. the core launches batches on workers with room: send them
            self._schedule()
            # 4. liveness both ways (a silent worker is lost; the no-worker grace runs out)
            self._beat()
            self._forward()
            # 5. the collector's records, in one frame when due; a closed-loop traffic, what ended
            self.records.flush()
            self._tell_ends()
            # 6. done?
            if self.core.done():
                break
        self._finish("run complete" if not self.stopping else "interrupted")
        self._wait_for_collector()

    def _timeout_ms(self) -> int:
        t, due = now(), [d for d in (self.wake_at, self.records.due) if d is not None]
        return math.ceil(min([HEARTBEAT_INTERVAL_S, *(max(0.0, d - t) for d in due)]) * 1000)

    # --- message handlers -------------------------------------------------------------------------
    def _handle(self, sender: bytes, msg: object) -> None:
        wid, t = sender.decode(errors="replace"), now()
        why = self.gate.refusal(sender, msg, t)  # a forged request or a second traffic: counted, never taken
        if why:
            self.refusals.warn("refused messages", why)
            return
        self._maybe_back(msg.sender if isinstance(msg, Heartbeat) else wid, t)
        if isinstance(msg, RequestMsg):
            if self.core.knows(msg.request_id):  # refused and counted by the core: the first keeps the id
                self.duplicates.warn("refused requests whose id was taken", msg.request_id)
            else:
                self.records.add(Arrival(dataclasses.replace(msg, prompt_tokens=b""), t))
            self.core.on_request(msg, t)
        elif isinstance(msg, BatchDone):
            batch = self.core.on_batch_done(wid, msg.batch_id, msg.oom, t)
            if batch is not None and not msg.oom and self.closed_loop:  # its worker decided each row's end
                self.ended += [r.request_id for r in batch]
        elif isinstance(msg, WorkerHello):
            self._on_hello(wid, msg, t)
        elif isinstance(msg, WorkerCapacity):
            rows = self.core.on_capacity(wid, msg.max_rows)
            if rows is not None:
                log.info("worker %s now runs at most %d rows (%s)", wid, rows, msg.reason)
        elif isinstance(msg, TrafficHello):
            self.traffic, self.closed_loop = sender, msg.concurrency > 0
            self._maybe_start()
        elif isinstance(msg, ClockPing):
            send_routed(self.router, sender, encode(ClockPong(msg.seq, msg.t_send, now())))
        elif isinstance(msg, EndOfStream):
            self.core.end_of_stream()
            self.stats["sent_by_traffic"] = msg.sent
            with contextlib.suppress(zmq.ZMQError):  # every frame before it was taken: the traffic may close
                send_routed(self.router, sender, encode(EndOfStreamAck(self.gate.received)), zmq.NOBLOCK)

    def _maybe_back(self, wid: str, t: float) -> None:
        """A worker lost for its silence spoke again (it was stalled): it rejoins, and what it still runs
        of the requests requeued at its loss is its own again (the core's on_back)."""
        hello = self.silent.pop(wid, None)
        if hello is not None and wid not in self.core.workers:
            taken = self.core.on_back(wid, hello, t)
            log.warning("worker %s is back after its silence: it rejoins with %d request(s) it still runs",
                        wid, taken)

    def _on_hello(self, wid: str, hello: WorkerHello, t: float) -> None:
        log.info("worker %s joined: %s %s (%s, max batch %d)", wid, hello.backend, hello.model, hello.mode,
                 hello.max_batch_size)
        lost = self.core.on_hello(wid, hello, t)
        if lost is not None:
            log.error("worker %s rejoined with %d request(s) in flight", wid, lost)
        self._maybe_start()

    def _maybe_start(self) -> None:
        """Start the traffic once it, the collector and the workers are there: the workers the run has, less
        those that ended before they were ready (a worker killed at start-up is not waited for)."""
        ended = self.workers_ended.value if self.workers_ended is not None else 0
        if self.t0 is not None or self.traffic is None or len(self.core.workers) < max(1, self.min_workers - ended):
            return
        if COLLECTOR_ID not in self.collector.heard:  # its records would wait unread: start-up goes on
            return
        self.t0 = now() + START_LEAD_S
        self.gate.start(self.t0)
        self.cpu_at_start = time.process_time()  # the run's CPU counts from here (not imports, not waiting)
        self.records.add(RunInfo({**self.settings, "t0": self.t0, "workers": self.core.workers_info()}))
        send_routed(self.router, self.traffic, encode(Start(self.t0)))
        self.inbox.heard[self.traffic.decode(errors="replace")] = now()  # its liveness counts from Start

    # --- scheduling -------------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Send what the core launches (nothing before traffic was told to start). A worker that a send
        cannot reach is lost, and the core is asked again: its requests need not wait for the next event."""
        self.wake_at = None
        while self.t0 is not None:
            clamped = self.core.stats["rows_clamped"]
            decisions = self.core.schedule(now())
            self.wake_at = decisions.wake_at
            if self.core.stats["rows_clamped"] > clamped:
                self.clamps.warn("launches cut to the worker's free rows (the strategy launched more)",
                                 f"{self.core.stats['rows_clamped'] - clamped} row(s) left queued")
            if self._send_all(decisions.launches):
                return

    def _send_all(self, launches: list[Launch]) -> bool:
        """Send each worker's launch (in frames within the limit) and record each frame sent; False when a
        worker was unreachable (the core then took back what it did not get, and lost it)."""
        reachable = True
        for launch in launches:  # one per worker
            t, wid = now(), launch.worker_id
            frames, too_large = launch.frames(t)
            for part, reason in too_large:  # never sent: the worker would drop the connection
                log.error("batch %d not dispatched: %s", part.rows[0].batch_id, reason)
                self.core.on_unsendable(part, reason, t)
            try:
                while frames:
                    send_routed(self.router, wid.encode(), frames[0][1])
                    self.records.add(frames.pop(0)[0].record(t))
            except zmq.ZMQError as exc:  # the worker is gone (ROUTER_MANDATORY): this frame was not sent
                log.error("worker %s lost (unreachable: %s)", wid, exc)
                self.core.on_send_failed([part for part, _ in frames], now())
                reachable = False
        return reachable

    # --- liveness and the end ---------------------------------------------------------------------
    def _beat(self) -> None:
        t = now()
        if t - self.last_beat >= HEARTBEAT_INTERVAL_S:
            self.last_beat = t
            for wid in list(self.core.workers):
                self._send_worker(wid, Heartbeat(SCHEDULER_ID, t))
            self._beat_collector()
        for wid, state in list(self.core.workers.items()):
            if self.inbox.silent_s(wid, t) > self.liveness_s:
                log.error("worker %s lost (silent for %.1f s)", wid, self.inbox.silent_s(wid, t))
                self.silent[wid] = state.hello  # it may be stalled, not dead: see _maybe_back
                self.core.on_worker_lost(wid, t)
        traffic_silent_s = self.inbox.silent_s((self.traffic or b"").decode(errors="replace"), t)
        if self.t0 is not None and not self.core.eos and traffic_silent_s > self.liveness_s:
            log.error("traffic silent for %.1f s: treating it as the end of the stream", traffic_silent_s)
            self.stats["traffic_lost"] = 1
            self.gate.end(f"the traffic was silent for {traffic_silent_s:.1f} s")
            self.core.end_of_stream()
        if self.stream_ended is not None and self.stream_ended.is_set():
            self.gate.end("the traffic's process ended")
            self.core.end_of_stream()
        self.core.tick(t)
        self._maybe_start()  # a worker may have ended before its hello: the others need not wait for it

    def _beat_collector(self) -> None:
        """A Heartbeat the collector answers with its own (a full pipe to it: a stalled one, is left to wait)."""
        with contextlib.suppress(zmq.ZMQError):
            self.coll.send(encode(Heartbeat(SCHEDULER_ID, now())), zmq.NOBLOCK)

    def _collector_heard(self) -> None:
        """The collector's answers: the first one may start the traffic."""
        first = COLLECTOR_ID not in self.collector.heard
        self.collector.drain()
        if first and COLLECTOR_ID in self.collector.heard:
            log.info("the collector answered")
            self._maybe_start()

    def _wait_for_collector(self) -> None:
        """Keep the socket to the collector until it took RunEnd (and so every record before it), up to the
        liveness window; after a stop signal the socket's usual linger (the run is being stopped)."""
        signalled = self.stop_signal
        wait_s = LINGER_MS / 1000 if signalled else self.liveness_s
        if not wait_for_ack(self.collector, "RunEnd", wait_s, lambda: self.stop_signal != signalled):
            log.error("the collector did not take the run's end within %.1f s: records still queued may be lost",
                      wait_s)

    def _send_worker(self, wid: str, msg: object) -> None:
        """A worker whose connection is gone (it ended) is lost at once; a full pipe (a stalled worker)
        is left to the liveness window."""
        try:
            send_routed(self.router, wid.encode(), encode(msg), zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH and wid in self.core.workers:
                log.error("worker %s lost (disconnected)", wid)
                self.core.on_worker_lost(wid, now())

    def _finish(self, why: str) -> None:
        # only when interrupted: nothing may vanish
        self.core.fail_queue(detailed(FailureKind.SCHEDULER_STOPPED, why), now())
        self._forward()
        for wid in self.core.workers:
            self._send_worker(wid, Shutdown(why))
        if self.traffic is not None:
            with contextlib.suppress(zmq.ZMQError):
                send_routed(self.router, self.traffic, encode(Shutdown(why)), zmq.NOBLOCK)
        cpu_s = time.process_time() - self.cpu_at_start if self.t0 is not None else 0.0  # from Start on
        stats = {**self.core.stats, **self.stats, **self.gate.stats, "cpu_s": cpu_s,
                 "records_send_s": self.records.send_s}  # waiting on a collector behind: it slowed us
        self.records.add(RunEnd(self.core.stats["submitted"], list(self.core.workers), stats))
        self.records.flush(force=True)

    def _forward(self) -> None:
        """The core's terminal records, to the collector (and, closed loop, their ids to the traffic)."""
        records = self.core.drain()
        self.records.extend(records)
        if self.closed_loop:
            self.ended += [r.request_id for r in records]

    def _tell_ends(self) -> None:
        """A closed-loop traffic learns, in one frame, which requests ended (its clients send again)."""
        if self.ended and self.traffic is not None:
            with contextlib.suppress(zmq.ZMQError):  # a traffic that is gone is not waited for
                send_routed(self.router, self.traffic, encode(RequestsEnded(self.ended, now())), zmq.NOBLOCK)
            self.ended = []

    def close(self) -> None:
        """Sockets first, then the context."""
        self.router.close()
        self.coll.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def run_scheduler(policy: Policy, scheduler_addr: str, collector_addr: str, **kwargs) -> int:
    """Run the scheduler until the run ends; SIGINT/SIGTERM end it early, cleanly (exit code 128 + the
    signal, so a launcher can tell an early end from the run's). A set
    `stream_ended` event (the launcher saw traffic die) ends the stream: what arrived is still served."""
    sched = Scheduler(policy, scheduler_addr, collector_addr, **kwargs)

    def stop(signum: int) -> None:
        sched.stopping, sched.stop_signal = True, signum

    with on_stop_signal(stop):
        try:
            sched.run()
        finally:
            sched.close()
    return 128 + sched.stop_signal if sched.stop_signal else 0  # a signal's conventional exit code
