"""What a worker sends, kept and sent in bundles: the scheduler's BatchDones after each step (its credit),
the collector's records every few milliseconds (an echo worker steps thousands of times a second; a frame
per step cost more CPU in the I/O threads and the collector than the step itself); and its heartbeat, on
its own thread and socket, so a long model step never looks like death."""
import threading
from collections.abc import Callable, Mapping

import zmq

from batchlab.protocol import BatchDone, Heartbeat, Tokens, encode, now
from batchlab.protocol.addresses import heartbeat_id
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S, Bundler, make_socket, send_split
from batchlab.worker.backend import StepOutput

RECORD_FLUSH_INTERVAL_S = 0.005  # collector records wait at most this long (their times travel inside them)


class Outbox:
    """The collector's records and the scheduler's BatchDones of the current step, in order."""

    def __init__(self, sched: zmq.Socket, coll: zmq.Socket, to_scheduler: Callable[[float], float],
                 keep_trying: Callable[[], bool] | None = None) -> None:
        self.sched, self.coll = sched, coll
        self.to_scheduler = to_scheduler  # this host's clock -> the scheduler's
        self.records = Bundler(coll, RECORD_FLUSH_INTERVAL_S, keep_trying=keep_trying)  # (protocol.sockets.send_split)
        self.dones: list[BatchDone] = []

    def record(self, msg: object) -> None:
        """A message for the collector."""
        self.records.add(msg)

    def done(self, msg: BatchDone) -> None:
        """A batch is over: the collector records it, the scheduler frees its credit."""
        self.records.add(msg)
        self.dones.append(msg)

    def tokens(self, step: int, out: StepOutput, batch_of: Mapping[int, int]) -> None:
        """One Tokens record per distinct token time (a backend may stamp rows at different moments of
        one step: decode tokens when the forward's results reached the host, joiners after prefill), each
        token with its row's batch (`batch_of`: request_id -> batch_id of the rows the worker runs)."""
        if not out.request_ids:
            return
        times = out.times or [out.time] * len(out.request_ids)
        start = 0
        for i in range(1, len(times) + 1):
            if i == len(times) or times[i] != times[start]:
                rids = out.request_ids[start:i]
                self.records.add(Tokens(step, self.to_scheduler(times[start]), rids, [batch_of[r] for r in rids],
                                        out.token_ids[start:i]))
                start = i

    def flush(self, *, all_records: bool = True) -> None:
        """BatchDones to the scheduler, now; then the collector's records, when `all_records` (the worker
        is about to wait, or stops), or when they are due or many. Each peer's as one frame, in order."""
        if self.dones:
            send_split(self.sched, self.dones)
            self.dones = []
        self.records.flush(force=all_records)


class HeartbeatThread:
    """Sends Heartbeat(worker_id) to the scheduler every HEARTBEAT_INTERVAL_S while the process lives."""

    def __init__(self, ctx: zmq.Context, scheduler_addr: str, worker_id: str, keys: str | None = None) -> None:
        self.ctx, self.addr, self.worker_id, self.keys = ctx, scheduler_addr, worker_id, keys
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        """Begin beating."""
        self.thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread (its socket closes inside it)."""
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _run(self) -> None:
        sock = make_socket(self.ctx, zmq.DEALER, self.addr, bind=False, identity=heartbeat_id(self.worker_id),
                           keys=self.keys)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            while not self.done.is_set():
                sock.send(encode(Heartbeat(self.worker_id, now())), zmq.NOBLOCK)
                self.done.wait(HEARTBEAT_INTERVAL_S)
        except zmq.ZMQError:
            pass
        finally:
            sock.close()
