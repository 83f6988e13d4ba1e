"""A worker refuses a Dispatch beyond the rows it announced, or with ids it runs already: each refused
row fails once with the reason, a running request keeps its own end, and the worker goes on serving
(and answers Shutdown at once). Pure `admit` tables, hypothesis over colliding ids, and a real Worker
loop in a thread (tests.test_worker_robustness's rig)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.protocol import BatchDone, Dispatch, FailedRow, Tokens, WorkerBye, now
from batchlab.worker.admission import admit
from batchlab.worker.backend import BackendInfo
from batchlab.worker.sim import SimBackend
from tests.test_worker_robustness import WORKER, WorkerRig, row
from tests.wire_cases import BAD_CASES, frame


def info(max_rows: int, continuous: bool) -> BackendInfo:
    return BackendInfo("echo", "m", "continuous" if continuous else "static", max_rows, 1, 10**12)


def rows(batch_id: int, *ids: int) -> list:
    """Requests `ids` as rows of batch `batch_id`."""
    return [row(batch_id, rid) for rid in ids]


def failed(reason: str, *ids: int) -> list[FailedRow]:
    return [FailedRow(rid, reason) for rid in ids]


def request_ids(batch: list) -> list[int]:
    return [r.request.request_id for r in batch]


def test_a_static_batch_over_the_announced_rows_fails_every_row_with_the_limit_named():
    a = admit(Dispatch(0.0, "full", rows(3, *range(10))), "w0", info(8, False), {}, {})
    assert a.accepted == [] and a.refused == ["batch 3 of 10 rows refused: 10 rows > 8 announced"]
    (done,) = a.answers
    assert done.batch_id == 3 and done.finished == [] and not done.oom
    assert done.failed == failed("refused: 10 rows > 8 announced", *range(10))


def test_a_continuous_worker_counts_its_running_rows_against_the_announced_maximum():
    msg = Dispatch(0.0, "credit", rows(5, 10) + rows(6, 11) + rows(7, 12))
    a = admit(msg, "w0", info(4, True), {0: None}, {1: 0, 2: 0})  # two run: room for two more
    assert [(bid, request_ids(batch)) for bid, batch in a.accepted] == [(5, [10]), (6, [11])]
    assert [(d.batch_id, d.failed) for d in a.answers] == [(7, failed("refused: 1 rows > 4 announced", 12))]


def test_a_dispatchs_rows_are_grouped_by_their_batch_ids_in_order_of_first_row():
    msg = Dispatch(0.0, "credit", rows(5, 10) + rows(6, 11) + rows(5, 12))
    a = admit(msg, "w0", info(8, False), {}, {})
    assert [(bid, request_ids(batch)) for bid, batch in a.accepted] == [(5, [10, 12]), (6, [11])]


def test_a_row_whose_id_runs_already_is_left_to_its_request_and_the_others_fail():
    a = admit(Dispatch(0.0, "full", rows(2, 7, 1, 8)), "w0", info(8, True), {0: None}, {1: 0})
    assert a.accepted == []
    assert a.answers[0].failed == failed("refused: request id 1 is taken", 7, 8)


def test_a_batch_id_that_runs_already_gets_no_answer_that_would_end_the_live_one():
    a = admit(Dispatch(0.0, "full", rows(0, 9)), "w0", info(8, True), {0: None}, {1: 0})
    assert a.accepted == [] and a.answers == [] and len(a.refused) == 1


def test_an_id_twice_in_one_batch_fails_once():
    a = admit(Dispatch(0.0, "full", rows(1, 4, 4, 5)), "w0", info(8, False), {}, {})
    assert a.answers[0].failed == failed("refused: request id 4 is taken", 4, 5)


@settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=5), min_size=1, max_size=5),
       st.sets(st.integers(0, 12), max_size=4), st.integers(1, 8), st.booleans())
def test_no_id_ends_twice_and_no_running_id_is_touched(batches, live, max_rows, continuous):
    msg = Dispatch(0.0, "credit", [r for i, b in enumerate(batches) for r in rows(10 + i, *b)])
    live_ids = {rid: 0 for rid in live}
    a = admit(msg, "w0", info(max_rows, continuous), {0: None}, live_ids)
    run = [rid for _, batch in a.accepted for rid in request_ids(batch)]
    ended = [r.request_id for d in a.answers for r in d.failed]
    assert len(run + ended) == len(set(run + ended))  # one end each
    assert not (set(run + ended) & live)
    assert len(a.accepted) + len(a.refused) == len(batches)
    room = max(0, max_rows - len(live)) if continuous else max_rows
    assert sum(len(b) for _, b in a.accepted) <= (room if continuous else max_rows * len(batches))
    assert all(len(b) <= max_rows for _, b in a.accepted)


def test_a_worker_refuses_a_huge_dispatch_at_once_and_still_serves_and_stops():
    rig = WorkerRig(SimBackend("echo", mode="static", max_batch_size=8, backend="echo"))
    try:
        rig.send(Dispatch(now(), "full", rows(0, *range(20_000))))
        done = rig.wait_for(lambda m: isinstance(m, BatchDone) and m.batch_id == 0)
        assert done.finished == [] and len(done.failed) == 20_000
        assert done.failed[0] == FailedRow(0, "refused: 20000 rows > 8 announced")
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
