"""The worker's heartbeat: its own thread and socket, so a long model step never looks like death."""
import threading

import zmq

from batchlab.protocol import Heartbeat, encode, now
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S, make_socket


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
        sock = make_socket(self.ctx, zmq.DEALER, self.addr, bind=False, identity=f"{self.worker_id}.hb",
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
