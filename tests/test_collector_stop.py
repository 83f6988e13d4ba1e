"""A stop signal does not drop what is already queued at the collector: it reads on until the roles
said goodbye or nothing more arrives."""
import threading

import zmq

from batchlab.collector.parts import PartWriter
from batchlab.collector.process import _serve
from batchlab.collector.store import RunStore
from batchlab.protocol import Tokens, encode

FRAMES = 25_000  # more than one drain pass takes (MAX_FRAMES_PER_POLL)


def test_frames_queued_before_a_stop_signal_are_all_recorded(tmp_path):
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)  # the collector's socket, a role's
    for sock in (pull, push):  # room for every frame: nothing reads them before the stop
        sock.setsockopt(zmq.SNDHWM, 2 * FRAMES)
        sock.setsockopt(zmq.RCVHWM, 2 * FRAMES)
    pull.bind(f"ipc://{tmp_path}/c.sock")
    push.connect(f"ipc://{tmp_path}/c.sock")
    for i in range(FRAMES):
        push.send(encode(Tokens(i, float(i), [1], [7], [i % 32000])))
    while pull.poll(0) == 0:  # the first frame is in
        pull.poll(50)
    store, stop = RunStore(), threading.Event()
    stop.set()  # the signal came before the collector read anything
    reason = _serve(pull, store, PartWriter(tmp_path), stop, grace_s=10.0, idle_timeout_s=None)
    assert reason.startswith("signal")
    assert sum(len(v) for v in store.tokens.values()) == FRAMES
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()
