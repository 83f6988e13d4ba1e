"""The collector process: receive every event (a ROUTER: it answers a role's last record and the scheduler's
heartbeat), join it in a RunStore, write the run's tables."""
import contextlib
import logging
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import zmq

from batchlab.collector.merge import merge_run
from batchlab.collector.parts import PartWriter, write_final
from batchlab.collector.store import RunStore
from batchlab.collector.summary import Summary
from batchlab.collector.tables import Tables, harness_cpu
from batchlab.protocol import CollectorAck, Heartbeat, RunEnd, WorkerBye, encode
from batchlab.protocol.addresses import COLLECTOR_ID
from batchlab.protocol.clock import now
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.inbox import Inbox
from batchlab.protocol.run_dir import RunDir, footer_notes
from batchlab.protocol.security import start_authenticator
from batchlab.protocol.signals import on_stop_signal
from batchlab.protocol.sockets import RECORDS_HWM, make_socket, send_routed

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
FLUSH_INTERVAL_S = 1.0  # how often new rows go to a part file
STOP_IDLE_S = 1.0  # after a stop signal: stop once nothing arrived for this long (or every bye is in)
STOP_DRAIN_MAX_S = 20.0  # ... and at the latest this long after the signal (time for a launcher to stop the run)
# Frames decoded and recorded per pass (each a bundle of up to MAX_RECORDS_PER_FRAME records): a pass holds their
# messages at once, so a backlog read 10,000 frames at a time held gigabytes for many seconds without a flush
FRAMES_PER_PASS = 100


class _Loop:
    """The loop's clocks and flags (monotonic seconds)."""

    def __init__(self) -> None:
        t = now()
        self.last_message_s = self.last_flush_s = t
        self.run_end_s: float | None = None
        self.stop_s: float | None = None  # when a stop signal came
        self.stop_signal = 0  # which signal (0: none)
        self.run_stopping = False  # the signal came mid-run and a launcher was asked to stop the run
        self.stop_reason = ""


def schedule_notes(out_dir: Path) -> dict:
    """How the run's schedule was made (Schedule.notes: prompt source, capped lengths, trace window) from
    out_dir/schedule.parquet's footer; {} when the file, or its notes, are absent or unreadable."""
    path = RunDir(out_dir).schedule
    if not path.is_file():
        return {}
    try:
        return footer_notes(pq.read_metadata(path).metadata or {})
    except Exception as exc:  # pyarrow raises several types for a bad file; the notes are an extra
        log.warning("collector: cannot read the schedule's notes in %s: %s", path, exc)
        return {}


def _drain(inbox: Inbox, store: RunStore) -> None:
    """Record every message already queued (at most the inbox's MAX_FRAMES_PER_POLL frames); one that
    decodes but cannot be used is a rejected one too. A role's last record (RunEnd, WorkerBye) is
    acknowledged to its sender (it keeps its socket until then), a Heartbeat answered (the scheduler
    starts the traffic once the collector was heard)."""
    for sender, msg in inbox.drain():
        try:
            store.handle(msg)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            inbox.reject(exc)
        if isinstance(msg, (RunEnd, WorkerBye)):
            _answer(inbox.sock, sender, CollectorAck(type(msg).__name__))
        elif isinstance(msg, Heartbeat):
            _answer(inbox.sock, sender, Heartbeat(COLLECTOR_ID, now()))


def _answer(sock: zmq.Socket, sender: bytes, msg: object) -> None:
    """A reply to one sender; one that is gone, or whose pipe is full, goes without (it has its own limit)."""
    with contextlib.suppress(zmq.ZMQError):
        send_routed(sock, sender, encode(msg), zmq.NOBLOCK)


def _end_reason(store: RunStore, loop: _Loop, stop: threading.Event, grace_s: float,
                idle_timeout_s: float | None) -> str:
    """Why the loop should stop now ("" to go on)."""
    t = now()
    if store.run_end is not None and loop.run_end_s is None:
        loop.run_end_s = t
    if stop.is_set():
        return _drained_after_signal(store, loop, t)
    if store.all_byes_in():
        return "run end and every worker's bye"
    if loop.run_end_s is not None and t - loop.run_end_s > grace_s:
        return "grace expired after run end"
    if idle_timeout_s is not None and t - loop.last_message_s > idle_timeout_s:
        return "idle timeout"
    return ""


def _drained_after_signal(store: RunStore, loop: _Loop, t: float) -> str:
    """A stop signal does not drop what is queued: read on until every role said goodbye, or nothing
    came for STOP_IDLE_S (once the run's end is in, when a launcher is stopping the run), or
    STOP_DRAIN_MAX_S passed ("" to go on reading)."""
    loop.stop_s = t if loop.stop_s is None else loop.stop_s
    if store.all_byes_in():
        return "signal; every worker's bye was in"
    if t - loop.last_message_s > STOP_IDLE_S and (store.run_end is not None or not loop.run_stopping):
        return "signal; nothing more arrived"
    if t - loop.stop_s > STOP_DRAIN_MAX_S:
        return "signal; drain time over"
    return ""


def _serve(sock: zmq.Socket, store: RunStore, writer: PartWriter, stop: threading.Event,
           grace_s: float, idle_timeout_s: float | None, loop: _Loop | None = None) -> str:
    """The main loop; returns why it stopped."""
    loop = loop or _Loop()
    inbox = Inbox(sock, log, counters=store.counters, max_frames=FRAMES_PER_PASS)  # [sender, frame]
    while True:
        # 1. wait briefly for frames
        if sock.poll(POLL_TIMEOUT_MS, zmq.POLLIN):
            # 2. decode and record everything queued (bad frames counted)
            _drain(inbox, store)
            loop.last_message_s = inbox.last_frame_s
        # 3. periodic flush of new rows to a part file, and the counts for the launcher's progress line
        if now() - loop.last_flush_s >= FLUSH_INTERVAL_S:
            writer.write(store.take_parts())
            write_progress(writer.parts_dir.parent, store.counts())
            loop.last_flush_s = now()
        # 4. end conditions
        reason = _end_reason(store, loop, stop, grace_s, idle_timeout_s)
        if reason:
            return reason


def write_progress(out_dir: Path, counts: dict) -> None:
    """OUT/progress.json: the request counts so far (a launcher's status line reads it)."""
    try:
        write_json_atomic(RunDir(out_dir).progress, counts)
    except OSError:  # a status line is an extra: a full disk is reported where the tables fail
        pass


def finish_run(store: RunStore, writer: PartWriter, out_dir: Path, slos: dict | None) -> Tables:
    """The last rows to a part, then every table file merged from the parts; returns the summary (the
    tables are None: they are on disk already)."""
    writer.write(store.take_parts(final=True))  # the end of the run is on disk before merging
    return merge_run(store.view(), out_dir, slos)


def _on_signal(signum: int, store: RunStore, loop: _Loop, stop: threading.Event, stop_run) -> None:
    """A stop signal: note it; before the run's end, ask the launcher (`stop_run`, an event) to stop the run."""
    loop.stop_signal = loop.stop_signal or signum
    if stop_run is not None and store.run_end is None and not stop_run.is_set():  # set: the launcher stops it
        loop.run_stopping = True
        stop_run.set()
    stop.set()


def run_collector(address: str, out_dir: Path, *, slos: dict | None = None, grace_s: float = 10.0,
                  idle_timeout_s: float | None = None, keys: str | None = None, stop_run=None) -> Summary:
    """Collect one run's events from `address` into out_dir's tables; returns the summary (its
    `stop_signal`: the signal that stopped the collector, 0 when the run ended by itself)."""
    cpu_start_s = time.process_time()  # the collector's own CPU, for the summary's harness_cpu
    out_dir = Path(out_dir)
    store, writer, stop, loop = RunStore(), PartWriter(out_dir), threading.Event(), _Loop()
    ctx = zmq.Context()
    sock, auth = None, None
    try:
        with on_stop_signal(lambda signum: _on_signal(signum, store, loop, stop, stop_run)):
            auth = start_authenticator(ctx, keys) if keys else None  # make_socket refuses a bare bind
            sock = make_socket(ctx, zmq.ROUTER, address, bind=True, keys=keys, hwm=RECORDS_HWM)
            reason = _serve(sock, store, writer, stop, grace_s, idle_timeout_s, loop)
            log.info("collector: stopping (%s)", reason)
            tables = finish_run(store, writer, out_dir, slos)
            summary = tables.summary
            summary.end_reason, summary.stop_signal = reason, loop.stop_signal
            summary.harness_cpu = harness_cpu(store.view(), time.process_time() - cpu_start_s)
            if notes := schedule_notes(out_dir):
                summary.schedule = notes
            write_final(out_dir, tables)
            write_progress(out_dir, store.counts())
            return tables.summary
    finally:
        if sock is not None:
            sock.close()
        if auth is not None:
            auth.stop()
        ctx.term()
