"""One message per scheduling pass: a continuous scheduler sends a pass's requests to a worker as one
Dispatch (one batch per request), the worker answers each batch once, and nothing is lost or doubled."""
from collections import Counter

from batchlab.protocol import (BatchDone, BatchLaunch, Dispatch, EndOfStream, RunEnd, Start, Tokens, TrafficHello,
                               WorkerBye)
from batchlab.protocol.messages import pack_tokens
from batchlab.worker.sim import SimBackend
from tests.test_worker_robustness import PROMPT, WORKER, SchedulerRig, WorkerRig, hello, is_dispatch, request


def test_a_pass_over_queued_requests_sends_one_dispatch_with_a_batch_per_request():
    rig = SchedulerRig()
    try:
        rig.traffic.send(TrafficHello(4, "hash", 1.0))
        for rid in range(4):
            rig.traffic.send(request(rid))
        rig.traffic.settled()  # all four are queued before any worker is there to take them
        rig.worker.send(hello(max_rows=8))
        rig.traffic.wait_for(lambda m: isinstance(m, Start))
        dispatch = rig.worker.wait_for(is_dispatch)
        assert [r[0] for r in dispatch.requests] == [0, 1, 2, 3] and dispatch.sizes == [1, 1, 1, 1]
        batches = dispatch.batches()
        rig.worker.send(BatchDone(batches[0][0], WORKER, 0.0, 0.0, [0]))
        for bid, rows in batches[1:]:
            rig.worker.send(BatchDone(bid, WORKER, 0.0, 0.0, [rows[0][0]]))
        rig.traffic.send(EndOfStream(4))
        rig.recorded_until(lambda m: isinstance(m, RunEnd))  # the run ends: every batch came back
    finally:
        rig.close()
    assert sum(isinstance(m, Dispatch) for m in rig.worker.seen) == 1
    launches = [m for m in rig.recorded if isinstance(m, BatchLaunch)]
    assert [(m.batch_id, m.request_ids) for m in launches] == [(bid, [rows[0][0]]) for bid, rows in batches]
    assert {m.scheduled_time for m in launches} == {dispatch.scheduled_time}


def test_a_worker_ends_each_batch_of_a_grouped_dispatch_exactly_once():
    rig = WorkerRig(SimBackend("echo", mode="continuous", max_batch_size=8, backend="echo"))
    try:
        rows = [[rid, len(PROMPT), 3, pack_tokens(PROMPT)] for rid in (1, 2, 3, 4)]
        rig.send(Dispatch(10, 0.0, "credit", rows, [1, 2, 1]))  # batches 10: [1], 11: [2, 3], 12: [4]
        rig.wait_for(lambda _m: {10, 11, 12} <= {s.batch_id for s in rig.seen if isinstance(s, BatchDone)})
    finally:
        recorded = rig.close()
    done = {m.batch_id: sorted(m.finished) for m in rig.seen if isinstance(m, BatchDone)}
    assert done == {10: [1], 11: [2, 3], 12: [4]}
    assert Counter(m.batch_id for m in recorded if isinstance(m, BatchDone)) == {10: 1, 11: 1, 12: 1}
    tokens = Counter(rid for m in recorded if isinstance(m, Tokens) for rid in m.request_ids)
    assert tokens == {1: 3, 2: 3, 3: 3, 4: 3}
    assert isinstance(recorded[-1], WorkerBye)
