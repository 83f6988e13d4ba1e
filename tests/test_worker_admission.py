"""A worker refuses a Dispatch beyond the rows it announced, or with ids it runs already: each refused
row fails once with the reason, a running request keeps its own end, and the worker goes on serving
(and answers Shutdown at once). Pure `admit` tables, hypothesis over colliding ids, and a real Worker
loop in a thread (tests.test_worker_robustness's rig)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.protocol import BatchDone, Dispatch, Tokens, WorkerBye, now
from batchlab.protocol.messages import pack_tokens
from batchlab.worker.admission import admit
from batchlab.worker.backend import BackendInfo
from batchlab.worker.sim import SimBackend
from tests.test_worker_robustness import PROMPT, WORKER, WorkerRig
from tests.wire_cases import BAD_CASES, frame

TOKENS = pack_tokens(PROMPT)


def info(max_rows: int, continuous: bool) -> BackendInfo:
    return BackendInfo("echo", "m", "continuous" if continuous else "static", max_rows, 1, 10**12)


def rows(*ids: int) -> list[list]:
    return [[rid, len(PROMPT), 4, TOKENS] for rid in ids]


def test_a_static_batch_over_the_announced_rows_fails_every_row_with_the_limit_named():
    a = admit(Dispatch(3, 0.0, "full", rows(*range(10))), "w0", info(8, False), {}, {})
    assert a.accepted == [] and a.refused == ["batch 3 of 10 rows refused: 10 rows > 8 announced"]
    (done,) = a.answers
    assert done.batch_id == 3 and done.finished == [] and not done.oom
    assert done.failed == [[rid, "refused: 10 rows > 8 announced"] for rid in range(10)]


def test_a_continuous_worker_counts_its_running_rows_against_the_announced_maximum():
    msg = Dispatch(5, 0.0, "credit", rows(10, 11, 12), [1, 1, 1])
    a = admit(msg, "w0", info(4, True), {0: None}, {1: 0, 2: 0})  # two run: room for two more
    assert [bid for bid, _ in a.accepted] == [5, 6]
    assert [(d.batch_id, d.failed) for d in a.answers] == [(7, [[12, "refused: 1 rows > 4 announced"]])]


def test_a_row_whose_id_runs_already_is_left_to_its_request_and_the_others_fail():
    a = admit(Dispatch(2, 0.0, "full", rows(7, 1, 8)), "w0", info(8, True), {0: None}, {1: 0})
    assert a.accepted == []
    assert a.answers[0].failed == [[7, "refused: request id 1 is taken"], [8, "refused: request id 1 is taken"]]


def test_a_batch_id_that_runs_already_gets_no_answer_that_would_end_the_live_one():
    a = admit(Dispatch(0, 0.0, "full", rows(9)), "w0", info(8, True), {0: None}, {1: 0})
    assert a.accepted == [] and a.answers == [] and len(a.refused) == 1


def test_an_id_twice_in_one_batch_fails_once():
    a = admit(Dispatch(1, 0.0, "full", rows(4, 4, 5)), "w0", info(8, False), {}, {})
    assert a.answers[0].failed == [[4, "refused: request id 4 is taken"], [5, "refused: request id 4 is taken"]]


@settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=5), min_size=1, max_size=5),
       st.sets(st.integers(0, 12), max_size=4), st.integers(1, 8), st.booleans())
def test_no_id_ends_twice_and_no_running_id_is_touched(batches, live, max_rows, continuous):
    msg = Dispatch(10, 0.0, "credit", rows(*[i for b in batches for i in b]), [len(b) for b in batches])
    live_ids = {rid: 0 for rid in live}
    a = admit(msg, "w0", info(max_rows, continuous), {0: None}, live_ids)
    run = [r[0] for _, batch in a.accepted for r in batch]
    failed = [row[0] for d in a.answers for row in d.failed]
    assert len(run + failed) == len(set(run + failed))  # one end each
    assert not (set(run + failed) & live)
    assert len(a.accepted) + len(a.refused) == len(batches)
    room = max(0, max_rows - len(live)) if continuous else max_rows
    assert sum(len(b) for _, b in a.accepted) <= (room if continuous else max_rows * len(batches))
    assert all(len(b) <= max_rows for _, b in a.accepted)


def test_a_worker_refuses_a_huge_dispatch_at_once_and_still_serves_and_stops():
    rig = WorkerRig(SimBackend("echo", mode="static", max_batch_size=8, backend="echo"))
    try:
        rig.send(Dispatch(0, now(), "full", rows(*range(20_000))))
        done = rig.wait_for(lambda m: isinstance(m, BatchDone) and m.batch_id == 0)
        assert done.finished == [] and len(done.failed) == 20_000
        assert done.failed[0] == [0, "refused: 20000 rows > 8 announced"]
        assert rig.dispatch(1, [(20_001, 3)]).finished == [20_001]
    finally:
        recorded = rig.close()  # Shutdown is answered: close() joins the worker's thread
    assert not rig.thread.is_alive()
    tokens = [rid for m in recorded if isinstance(m, Tokens) for rid in m.request_ids]
    assert tokens == [20_001] * 3  # the refused rows never ran


def test_a_worker_counts_every_frame_with_a_bad_value_and_serves_on():
    bad = [frame(msg, **{name: value}) for msg, name, value in BAD_CASES
           if type(msg).__name__ in ("Dispatch", "Shutdown", "ClockPong", "Heartbeat")]
    rig = WorkerRig(SimBackend("echo", mode="continuous", max_batch_size=8, backend="echo"))
    try:
        for f in bad:
            rig.router.send_multipart([WORKER.encode(), f])
        assert rig.dispatch(0, [(1, 3)]).finished == [1]
    finally:
        recorded = rig.close()
    bye = next(m for m in recorded if isinstance(m, WorkerBye))
    assert bye.stats["rejected_messages"] == len(bad) > 50
