"""One message per scheduling pass: a continuous scheduler sends a pass's requests to a worker as one
Dispatch whose rows name their batches (one per request), the worker answers each batch once and states
each token's batch, and nothing is lost or doubled."""
from collections import Counter

from batchlab.protocol import BatchDone, BatchLaunch, Dispatch, EndOfStream, RunEnd, Tokens, WorkerBye, WorkerCapacity
from batchlab.worker.sim import SimBackend
from tests.test_worker_robustness import WORKER, SchedulerRig, WorkerRig, hello, is_dispatch, request, row


def test_a_pass_over_queued_requests_sends_one_dispatch_with_a_batch_per_request():
    rig = SchedulerRig()
    try:
        rig.join(max_rows=8)
        rig.worker.send(WorkerCapacity(WORKER, 1, "out of memory"))  # one row at a time for now
        rig.worker.settled()
        rig.traffic.send(request(0))
        first = rig.worker.wait_for(is_dispatch)  # the worker is full
        for rid in range(1, 5):
            rig.traffic.send(request(rid))
        rig.traffic.settled()  # all four are queued: the worker has no room for them
        rig.worker.send(WorkerCapacity(WORKER, 8, "probe"))  # room for all four at once
        dispatch = rig.worker.wait_for(is_dispatch)
        pairs = [(r.request.request_id, r.batch_id) for r in dispatch.requests]
        assert [rid for rid, _ in pairs] == [1, 2, 3, 4] and len({bid for _, bid in pairs}) == 4
        for rid, bid in [(first.requests[0].request.request_id, first.requests[0].batch_id), *pairs]:
            rig.worker.send(BatchDone(bid, WORKER, 0.0, 0.0, [rid]))
        rig.traffic.send(EndOfStream(5))
        rig.recorded_until(lambda m: isinstance(m, RunEnd))  # the run ends: every batch came back
    finally:
        rig.close()
    assert sum(isinstance(m, Dispatch) for m in rig.worker.seen) == 2
    launches = [m for m in rig.recorded if isinstance(m, BatchLaunch)]  # one record of each message
    assert len(launches) == 2 and list(zip(launches[1].request_ids, launches[1].batch_ids)) == pairs
    assert launches[1].scheduled_time == dispatch.scheduled_time


def test_a_worker_ends_each_batch_of_one_dispatch_exactly_once_and_states_each_tokens_batch():
    rig = WorkerRig(SimBackend("echo", mode="continuous", max_batch_size=8, backend="echo"))
    try:
        batch_of = {1: 10, 2: 11, 3: 11, 4: 12}
        rig.send(Dispatch(0.0, "credit", [row(bid, rid, 3) for rid, bid in batch_of.items()]))
        rig.wait_for(lambda _m: {10, 11, 12} <= {s.batch_id for s in rig.seen if isinstance(s, BatchDone)})
    finally:
        recorded = rig.close()
    done = {m.batch_id: sorted(m.finished) for m in rig.seen if isinstance(m, BatchDone)}
    assert done == {10: [1], 11: [2, 3], 12: [4]}
    assert Counter(m.batch_id for m in recorded if isinstance(m, BatchDone)) == {10: 1, 11: 1, 12: 1}
    tokens = [(rid, bid) for m in recorded if isinstance(m, Tokens) for rid, bid in zip(m.request_ids, m.batch_ids)]
    assert Counter(tokens) == {(1, 10): 3, (2, 11): 3, (3, 11): 3, (4, 12): 3}  # each token names its batch
    assert isinstance(recorded[-1], WorkerBye)
