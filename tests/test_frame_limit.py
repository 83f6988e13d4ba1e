"""No frame passes the limit: the scheduler splits a pass's Dispatch into frames that fit, and fails
a batch that cannot fit alone with a reason naming its size and the limit (instead of sending it and
losing the worker, whose socket drops a sender that passes the limit). A real Scheduler in a thread,
its send path given a small limit."""
from batchlab.protocol import BatchDone, Dispatch, EndOfStream, RequestFailed, RequestMsg, RunEnd, WorkerCapacity
from batchlab.protocol import encode, now
from batchlab.protocol.messages import pack_tokens
from batchlab.scheduler.launch import Launch
from tests.test_worker_robustness import WORKER, dispatched, rig  # noqa: F401  (rig: a fixture)

LIMIT_BYTES = 1500
SHORT, LONG = pack_tokens(range(200)), pack_tokens(range(1000))  # 800 and 4000 bytes of token ids


def request(rid: int, tokens: bytes) -> RequestMsg:
    t = now()
    return RequestMsg(rid, t, t, len(tokens) // 4, 4, tokens)


def test_a_pass_over_the_frame_limit_is_split_and_a_request_that_cannot_fit_fails_naming_the_limit(rig, monkeypatch):
    frames = Launch.frames
    monkeypatch.setattr(Launch, "frames", lambda launch, t, max_bytes=LIMIT_BYTES: frames(launch, t, max_bytes))
    rig.join(max_rows=4)
    rig.worker.send(WorkerCapacity(WORKER, 1, "hold"))  # one row at a time: the rest queue up
    rig.worker.settled()
    rig.traffic.send(request(0, SHORT))
    first = rig.worker.wait_for(lambda m: isinstance(m, Dispatch))
    for rid in (1, 2, 3):
        rig.traffic.send(request(rid, SHORT))
    rig.traffic.send(request(4, LONG))
    rig.traffic.settled()
    rig.worker.send(WorkerCapacity(WORKER, 4, "room"))  # one pass now launches the four queued ones
    rig.worker.send(BatchDone(first.requests[0].batch_id, WORKER, now(), now(), [0]))
    failed = rig.recorded_until(lambda m: isinstance(m, RequestFailed))
    assert failed.request_id == 4 and f"over the {LIMIT_BYTES}-byte frame limit" in failed.reason
    rig.worker.settled()
    assert sorted(dispatched(rig.worker.seen)) == [0, 1, 2, 3]
    assert all(len(encode(m)) <= LIMIT_BYTES for m in rig.worker.seen if isinstance(m, Dispatch))
    for m in rig.worker.seen:
        if isinstance(m, Dispatch) and m is not first:
            for r in m.requests:  # a continuous worker's rows: a batch each
                rig.worker.send(BatchDone(r.batch_id, WORKER, now(), now(), [r.request.request_id]))
    rig.traffic.send(EndOfStream(5))
    end = rig.recorded_until(lambda m: isinstance(m, RunEnd))
    assert end.submitted == 5
