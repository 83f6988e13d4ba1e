"""The traffic process: push a schedule's requests to the scheduler at their planned times."""
import ctypes
import gc
import logging
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from batchlab.protocol import (EndOfStream, EndOfStreamAck, Heartbeat, RequestMsg, RequestsEnded, Shutdown, Start,
                               TrafficHello, encode)
from batchlab.protocol.addresses import SCHEDULER_ID, TRAFFIC_ID
from batchlab.protocol.clock import now, sleep_until
from batchlab.protocol.clock_sync import OffsetEstimate, measure
from batchlab.protocol.inbox import Inbox
from batchlab.protocol.messages import pack_tokens
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.security import is_loopback
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S, LINGER_MS, LIVENESS_S, make_socket
from batchlab.traffic.closed_loop import ClientPool
from batchlab.traffic.saved_schedule import SavedSchedule
from batchlab.traffic.schedule import Schedule, save_schedule, with_send_times
from batchlab.protocol.errors import TrafficStartTimeout

log = logging.getLogger(__name__)

INBOX_CHECK_INTERVAL_S = 0.005  # while sending flat out, look for Shutdown this often
WAIT_SLICE_S = 0.05  # longest blocking poll while waiting (bounds reaction to a signal)
SPIN_MARGIN_S = 0.002  # stop polling this long before a deadline; sleep_until does the rest
SEND_SPIN_S = 0.0  # no busy wait: with 1 µs timer slack a sleep ends ~20-50 µs late, and a spin burns the CPU 4 processes share
TIMER_SLACK_NS = 1_000  # Linux: sleeps overshoot by ~this, not the default 50 µs
PR_SET_TIMERSLACK = 29
SENDER_NICE = -10  # the open-loop clock runs before the roles it measures (where the OS allows it)


@dataclass(slots=True)
class _Control:
    """Why sending should stop (set by a signal handler or a Shutdown message), and liveness state."""

    stop_reason: str = ""
    inbox: Inbox | None = None  # the scheduler's messages (set once the socket is open)
    last_send: float = 0.0  # now() of the last frame sent (the scheduler counts any frame as a sign of life)
    ended: list[int] = field(default_factory=list)  # closed loop: ids the scheduler said ended, not yet read
    acked: bool = False  # the scheduler took our EndOfStream, so every frame before it
    stops: int = 0  # reasons to stop so far (one arriving while the stream's end waits for its ack ends the wait)
    told_to_stop: bool = False  # the scheduler sent Shutdown: it reads nothing more

    def stop(self, reason: str) -> None:
        """The first reason to stop wins."""
        self.stop_reason = self.stop_reason or reason
        self.stops += 1


@dataclass(slots=True)
class ClosedLoop:
    """Closed-loop load: `clients` clients, `think_s` between an end and the next send; what was sent, and
    when, is written to `record_to` (a schedule file: the send times become its arrival offsets)."""

    clients: int
    think_s: float = 0.0
    record_to: Path | None = None


def _beat(sock: zmq.Socket, ctl: _Control) -> None:
    """Send a Heartbeat if nothing went out for HEARTBEAT_INTERVAL_S (the scheduler drops silent traffic)."""
    t = now()
    if t - ctl.last_send >= HEARTBEAT_INTERVAL_S:
        sock.send(encode(Heartbeat(TRAFFIC_ID, t)))
        ctl.last_send = t


def _drain(ctl: _Control, timeout_s: float = 0.0) -> Start | None:
    """Read every waiting message (waiting up to timeout_s for the first); return a Start if one came."""
    start = None
    for _, msg in ctl.inbox.receive(math.ceil(timeout_s * 1000)):  # rounding down to 0 would busy-poll
        if isinstance(msg, Shutdown):
            ctl.told_to_stop = True
            ctl.stop(f"scheduler shutdown: {msg.reason}")
        elif isinstance(msg, Start):
            start = msg
        elif isinstance(msg, RequestsEnded):
            ctl.ended += msg.request_ids
        elif isinstance(msg, EndOfStreamAck):
            ctl.acked = True
    return start


def _linger_s(ctl: _Control, liveness_s: float) -> float:
    """How long the stream's end waits for the scheduler's ack: a whole liveness window when the traffic
    ended by itself (a scheduler stalled for less than that loses nothing), the socket's usual linger
    when a signal stopped it (the run is being stopped: a dead scheduler would never ack), none after
    the scheduler's own Shutdown (it reads nothing more)."""
    if ctl.told_to_stop:
        return 0.0
    return LINGER_MS / 1000 if ctl.stop_reason else liveness_s


def _wait_for_ack(ctl: _Control, linger_s: float) -> bool:
    """Keep the socket open until the scheduler took the EndOfStream (True), `linger_s` passed, or a
    new reason to stop came (a signal, Shutdown): then False, and frames still queued may be lost."""
    deadline, stops = now() + linger_s, ctl.stops
    while not ctl.acked and ctl.stops == stops:
        left = deadline - now()
        if left <= 0:
            return False
        _drain(ctl, min(left, WAIT_SLICE_S))
    return ctl.acked


def _wait_for_start(sock: zmq.Socket, ctl: _Control, timeout_s: float) -> float | None:
    """t0 from the scheduler's Start; None if told to stop first; TrafficStartTimeout after timeout_s."""
    deadline = now() + timeout_s
    while not ctl.stop_reason:
        left = deadline - now()
        if left <= 0:
            raise TrafficStartTimeout(f"no Start from the scheduler within {timeout_s:g} s "
                                      "(is it running, and are its workers warm?)")
        _beat(sock, ctl)
        start = _drain(ctl, min(left, WAIT_SLICE_S))
        if start is not None:
            return start.t0
    return None


def _wait_until(deadline: float, sock: zmq.Socket, ctl: _Control) -> None:
    """Block until `deadline`, reading the socket and beating meanwhile; returns early if told to stop."""
    while not ctl.stop_reason:
        left = deadline - now() - SPIN_MARGIN_S
        if left <= 0:
            sleep_until(deadline, SEND_SPIN_S)
            return
        _beat(sock, ctl)
        _drain(ctl, min(left, WAIT_SLICE_S))


def _send_all(sock: zmq.Socket, schedule: Schedule | SavedSchedule, t0: float, ctl: _Control,
              clock_offset_s: float = 0.0) -> int:
    """Send each request at t0 + offset (t0 on this host's clock); every time in a message is on the
    scheduler's clock (+ clock_offset_s, `off`: 0 on its host). Returns how many were sent before the end or
    a stop. The requests come in order from the schedule (a saved one is read a batch of rows at a time, so
    the traffic's memory does not grow with the run), their prompts packed (forwarded unread); one encoded
    RequestMsg per request."""
    send, next_check, off, sent = sock.send, 0.0, clock_offset_s, 0
    gc.collect()
    gc.freeze()  # what was built before sending is permanent while sending: collections need not scan it
    try:
        for request_id, offset_s, prompt_len, output_len, tokens in schedule.requests():
            arrival, t = offset_s + t0, now()
            if t >= next_check:  # 1. look for Shutdown between sends
                _drain(ctl)
                next_check = t + INBOX_CHECK_INTERVAL_S
            if arrival > t:  # 2. wait for the planned time
                _wait_until(arrival, sock, ctl)
                t = now()
            if ctl.stop_reason:
                return sent
            send(encode(RequestMsg(request_id, arrival + off, t + off, prompt_len, output_len, tokens)))  # 3.
            ctl.last_send, sent = t, sent + 1
        return sent
    finally:
        gc.unfreeze()


def _send_closed(sock: zmq.Socket, schedule: Schedule, t0: float, ctl: _Control, closed: ClosedLoop,
                 off: float = 0.0) -> int:
    """Closed loop: every client sends at t0, then each again when the scheduler says its request ended
    (plus the think time), until the schedule or the duration runs out. A request's arrival time is when
    its client became free: the send times are written to closed.record_to. Returns how many were sent."""
    frame = schedule.frame
    ids, prompt_lens, output_lens = (frame[c].tolist() for c in ("request_id", "prompt_len", "output_len"))
    pool = ClientPool(closed.clients, len(ids), closed.think_s, t0 + schedule.duration_s)
    pool.start(t0)
    arrivals: list[float] = []
    while not ctl.stop_reason:
        t = now()
        pool.on_ended(ctl.ended, t)  # 1. the scheduler's ends free their clients
        ctl.ended.clear()
        if pool.done(t):
            break
        for i, ready_at in pool.due(t):  # 2. each free client sends the next request
            sock.send(encode(RequestMsg(ids[i], ready_at + off, now() + off, prompt_lens[i], output_lens[i],
                                        pack_tokens(frame["prompt_tokens"].iat[i]))))
            arrivals.append(ready_at - t0)
            ctl.last_send = now()
        # 3. wait for an end, the next free client, or the stop (beating meanwhile)
        wake = pool.next_send_at()
        deadline = min(wake if wake is not None else math.inf, pool.stop_at, now() + WAIT_SLICE_S)
        _beat(sock, ctl)
        _drain(ctl, max(0.0, deadline - now()))
    if closed.record_to is not None:
        save_schedule(with_send_times(schedule, arrivals), closed.record_to)
    return len(arrivals)


def _sync_clock(scheduler_addr: str, ctl: _Control) -> OffsetEstimate:
    """The scheduler's clock minus ours: 0 on the same host (one monotonic clock), else measured by
    ping-pongs (minimum round trip, as the workers do; error ≤ rtt/2, logged)."""
    clock = OffsetEstimate()
    if is_loopback(scheduler_addr):
        clock.offset_s, clock.uncertainty_s = 0.0, 0.0
        return clock
    for msg in measure(ctl.inbox, clock, stopping=lambda: bool(ctl.stop_reason)):
        if isinstance(msg, Shutdown):
            ctl.stop(f"scheduler shutdown: {msg.reason}")
    if not clock.window and not ctl.stop_reason:
        raise TrafficStartTimeout(f"no clock pong from the scheduler at {scheduler_addr}")
    log.info("traffic: clock offset to the scheduler %.6f s (± %.6f s)", clock.offset_s, clock.uncertainty_s)
    return clock


def _punctual_sender() -> None:
    """Ask Linux for 1 µs timer slack, so a sleep ends on time, and for a higher priority, so a busy
    CPU delays a send less; either is skipped where the OS refuses it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if threading.current_thread() is threading.main_thread():  # a whole process: raise its priority
        try:
            os.setpriority(os.PRIO_PROCESS, 0, min(os.getpriority(os.PRIO_PROCESS, 0), SENDER_NICE))
        except (OSError, AttributeError):
            log.info("traffic: running at normal priority (raising it is not allowed here)")


def run_traffic(schedule: Schedule | SavedSchedule, scheduler_addr: str, *, out_dir: Path | None,
                start_timeout_s: float = 600, keys: str | None = None, on_start=None,
                closed: ClosedLoop | None = None, liveness_s: float = LIVENESS_S) -> int:
    """Announce the schedule, wait for Start, send every request on time (or, `closed`, when a client is
    free), end the stream and wait (up to `liveness_s`) until the scheduler took it; return sent.
    `on_start(t0)` is called when Start came, before the first send (the launcher's run clock). A
    SavedSchedule (the run's own file, read as it is sent) is open loop, and `out_dir` None."""
    if out_dir is not None:
        save_schedule(schedule, RunDir(out_dir).schedule)
        if closed is not None and closed.record_to is None:
            closed.record_to = RunDir(out_dir).schedule
    ctl = _Control()
    with on_stop_signal(lambda signum: ctl.stop(f"signal {signal.Signals(signum).name}")):
        return _announce_and_send(schedule, scheduler_addr, ctl, start_timeout_s, keys, on_start, closed, liveness_s)


def _announce_and_send(schedule: Schedule | SavedSchedule, scheduler_addr: str, ctl: _Control,
                       start_timeout_s: float, keys: str | None, on_start=None, closed: ClosedLoop | None = None,
                       liveness_s: float = LIVENESS_S) -> int:
    _punctual_sender()
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, scheduler_addr, bind=False, identity=TRAFFIC_ID, keys=keys)
    ctl.inbox, sent = Inbox(sock, log, peer=SCHEDULER_ID), 0
    try:
        # 0. a scheduler on another host has another monotonic clock: measure the offset (as workers do)
        clock = _sync_clock(scheduler_addr, ctl)
        # 1. announce
        sock.send(encode(TrafficHello(schedule.n_requests, schedule.content_hash, schedule.duration_s,
                                      closed.clients if closed else 0)))
        ctl.last_send = now()
        # 2. wait for the scheduler's Start
        t0 = _wait_for_start(sock, ctl, start_timeout_s)
        # 3. send on schedule
        if t0 is not None:
            t0 -= clock.offset_s  # Start's t0 is on the scheduler's clock
            if on_start is not None:
                on_start(t0)
            log.info("traffic: start at t0=%.3f, %d requests over %.1f s", t0, schedule.n_requests,
                     schedule.duration_s)
            if closed is None:
                sent = _send_all(sock, schedule, t0, ctl, clock.offset_s)
            else:
                sent = _send_closed(sock, schedule, t0, ctl, closed, clock.offset_s)
        # 4. end the stream, with the real count
        sock.send(encode(EndOfStream(sent)))
        log.info("traffic: sent %d of %d requests%s", sent, schedule.n_requests,
                 f" (stopped: {ctl.stop_reason})" if ctl.stop_reason else "")
        # 5. keep the socket until the scheduler took the stream: closing drops the frames still queued
        linger_s = _linger_s(ctl, liveness_s)
        if linger_s and not _wait_for_ack(ctl, linger_s):
            log.warning("traffic: the scheduler did not take the end of the stream within %.1f s%s: "
                        "requests still queued may not reach it", linger_s,
                        f" ({ctl.stop_reason})" if ctl.stop_reason else "")
        return sent
    finally:
        sock.close()
        ctx.term()
