"""SchedulerCore on its own: no sockets, no clock, every time given. The rules of what happens to a
request (queue, launch, OOM, lost workers, the no-worker grace) and that each ends exactly once."""
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from batchlab.protocol import RequestFailed, RequestMsg, WorkerHello
from batchlab.scheduler.core import MAX_LOSSES, WORKER_REJOIN_GRACE_S, SchedulerCore
from batchlab.scheduler.policies import Continuous, Dynamic, Naive

BIG_KV = 10**12


def hello(mode: str, rows: int = 4, worker_id: str = "w0") -> WorkerHello:
    return WorkerHello(worker_id, "sim", "fake", mode, rows, 1, BIG_KV, "cpu", "none")


def request(rid: int, t: float = 0.0, prompt_len: int = 4, output_len: int = 4) -> RequestMsg:
    return RequestMsg(rid, t, t, prompt_len, output_len)


def core_with(policy, *workers: WorkerHello, **bounds) -> SchedulerCore:
    core = SchedulerCore(policy, **bounds)
    for h in workers:
        core.on_hello(h.worker_id, h, 0.0)
    return core


def launched(decisions) -> list[list[int]]:
    """Each launched batch's request ids, in order (a launch may hold several batches)."""
    return [ids for launch in decisions.launches for ids in batches(launch).values()]


def batches(launch) -> dict[int, list[int]]:
    """{batch_id: its request ids} of one launch."""
    out: dict[int, list[int]] = {}
    for row in launch.rows:
        out.setdefault(row.batch_id, []).append(row.request.request_id)
    return out


def failures(core: SchedulerCore) -> dict[int, str]:
    return {f.request_id: f.reason for f in core.drain()}


# --- queueing and launching -------------------------------------------------------------------------
def test_naive_waits_for_a_full_batch_then_launches_it_on_size():
    core = core_with(Naive(3), hello("static"))
    for rid in range(2):
        core.on_request(request(rid), 0.0)
    assert core.schedule(0.0).launches == []
    core.on_request(request(2), 1.0)
    decisions = core.schedule(1.0)
    assert launched(decisions) == [[0, 1, 2]] and decisions.launches[0].reason == "size"
    assert decisions.launches[0].queue_len == 0 and not core.queue


def test_dynamic_asks_to_be_woken_at_the_oldest_requests_deadline_then_launches_on_age():
    core = core_with(Dynamic(8, 0.5, 16), hello("static"))
    core.on_request(request(0, t=1.0), 1.0)
    decisions = core.schedule(1.0)
    assert decisions.launches == [] and decisions.wake_at == 1.5
    decisions = core.schedule(1.5)
    assert launched(decisions) == [[0]] and decisions.launches[0].reason == "age"


def test_a_static_worker_runs_one_batch_at_a_time():
    core = core_with(Dynamic(2, 0.0, 16), hello("static"))
    for rid in range(4):
        core.on_request(request(rid), 0.0)
    assert launched(core.schedule(0.0)) == [[0, 1]]
    assert core.schedule(0.0).launches == []  # busy: no second batch while the first runs
    first = core.workers["w0"].inflight
    core.on_batch_done("w0", next(iter(first)), False, 1.0)
    assert launched(core.schedule(1.0)) == [[2, 3]]


def test_a_continuous_worker_gets_one_batch_per_request_up_to_its_rows():
    core = core_with(Continuous(16), hello("continuous", rows=3))
    for rid in range(5):
        core.on_request(request(rid), 0.0)
    decisions = core.schedule(0.0)
    (launch,) = decisions.launches  # one launch per worker per pass, a batch per row
    assert batches(launch) == {0: [0], 1: [1], 2: [2]} and launch.queue_len == 2
    assert launch.record(0.0).batch_ids == [0, 1, 2]
    assert [(r.batch_id, r.request.request_id) for r in launch.dispatch(0.0).requests] == [(0, 0), (1, 1), (2, 2)]
    core.on_batch_done("w0", 1, False, 1.0)
    assert launched(core.schedule(1.0)) == [[3]]


def test_a_reported_row_cap_replaces_the_hellos_but_never_exceeds_it():
    core = core_with(Continuous(16), hello("continuous", rows=4))
    assert core.on_capacity("w0", 1) == 1
    for rid in range(6):
        core.on_request(request(rid), 0.0)
    assert launched(core.schedule(0.0)) == [[0]]
    assert core.on_capacity("w0", 99) == 4 and core.on_capacity("nobody", 2) is None
    assert launched(core.schedule(0.0)) == [[1], [2], [3]]


def test_the_least_loaded_worker_is_asked_first():
    core = core_with(Continuous(16), hello("continuous", worker_id="a"), hello("continuous", worker_id="b"))
    core.on_request(request(0), 0.0)
    assert [launch.worker_id for launch in core.schedule(0.0).launches] == ["a"]
    core.on_request(request(1), 0.0)
    assert [launch.worker_id for launch in core.schedule(0.0).launches] == ["b"]


def test_arrivals_beyond_the_queue_bounds_fail_as_queue_full():
    core = core_with(Naive(8), hello("static"), max_queue=2)
    assert [core.on_request(request(rid), 0.0) for rid in range(3)] == [True, True, False]
    assert failures(core) == {2: "queue full"}
    by_tokens = core_with(Naive(8), hello("static"), max_queue_tokens=20)
    assert by_tokens.on_request(request(0, prompt_len=10, output_len=5), 0.0)
    assert not by_tokens.on_request(request(1, prompt_len=3, output_len=3), 0.0)  # 15 + 6 > 20
    assert failures(by_tokens) == {1: "queue full"}
    assert by_tokens.stats["queue_full"] == 1 and by_tokens.stats["submitted"] == 2


# --- out of memory ------------------------------------------------------------------------------------
def test_an_oom_batch_goes_back_to_the_front_in_order_and_the_cap_halves():
    policy = Dynamic(4, 0.0, 16)
    core = core_with(policy, hello("static"))
    for rid in range(6):
        core.on_request(request(rid), 0.0)
    (launch,) = core.schedule(0.0).launches
    assert core.on_batch_done("w0", launch.rows[0].batch_id, True, 1.0) == launch.requests
    assert [r.request_id for r in core.queue] == [0, 1, 2, 3, 4, 5] and not failures(core)
    assert launched(core.schedule(1.0)) == [[0, 1]]  # the policy's cap halved to 2
    assert core.stats["oom_batches"] == 1


def test_a_single_request_that_ooms_fails_as_not_fitting_alone():
    core = core_with(Naive(1), hello("static"))
    core.on_request(request(7), 0.0)
    (launch,) = core.schedule(0.0).launches
    core.on_batch_done("w0", launch.rows[0].batch_id, True, 2.0)
    assert core.drain() == [RequestFailed(7, "out of memory: does not fit alone", 2.0)]
    assert not core.queue


# --- lost workers -------------------------------------------------------------------------------------
def test_a_lost_workers_requests_are_requeued_once_then_fail():
    core = core_with(Continuous(16), hello("continuous", worker_id="a"), hello("continuous", worker_id="b"))
    core.on_request(request(0), 0.0)
    assert [launch.worker_id for launch in core.schedule(0.0).launches] == ["a"]
    core.on_worker_lost("a", 1.0)
    assert [r.request_id for r in core.queue] == [0] and not failures(core)
    assert [launch.worker_id for launch in core.schedule(1.0).launches] == ["b"]
    core.on_worker_lost("b", 2.0)
    assert MAX_LOSSES == 1 and failures(core) == {0: "worker lost: b"}
    assert core.stats["workers_lost"] == 2


def test_a_rejoining_worker_loses_what_its_old_process_ran():
    core = core_with(Continuous(16), hello("continuous"))
    core.on_request(request(3), 0.0)
    core.schedule(0.0)
    assert core.on_hello("w0", hello("continuous"), 1.0) == 1
    assert [r.request_id for r in core.queue] == [3]
    core.schedule(1.0)
    core.on_hello("w0", hello("continuous"), 2.0)
    assert failures(core) == {3: "worker rejoined: its running requests were lost"}


def test_a_worker_back_from_a_stall_gets_back_what_it_still_runs_and_its_batch_end_counts():
    core = core_with(Continuous(16), hello("continuous", worker_id="a"), hello("continuous", worker_id="b"))
    for rid in range(3):
        core.on_request(request(rid), 0.0)
    (launch,) = core.schedule(0.0).launches
    assert launch.worker_id == "a" and len(launch.batch_ids()) == 3
    bids = launch.batch_ids()
    core.on_worker_lost("a", 1.0)  # silent past the liveness window: requeued, as if dead
    assert [r.request_id for r in core.queue] == [0, 1, 2]
    core.workers["b"].max_rows = 1
    (moved,) = core.schedule(1.0).launches  # 0 runs on b now; 1 and 2 still wait
    assert moved.worker_id == "b" and [r.request_id for r in moved.requests] == [0]
    assert core.on_back("a", hello("continuous", worker_id="a"), 2.0) == 2
    assert not core.queue and {b: [r.request_id for r in g] for b, g in core.workers["a"].inflight.items()} == {
        bids[1]: [1], bids[2]: [2]}
    assert all(core.losses[r.request_id] == 0 for g in core.workers["a"].inflight.values() for r in g)
    assert [r.request_id for r in core.on_batch_done("a", bids[1], False, 3.0)] == [1]
    assert core.on_batch_done("a", bids[0], False, 3.0) is None  # 0 is b's now
    assert not failures(core) and core.stats["workers_lost"] == 1


def test_a_new_process_of_a_lost_worker_gets_nothing_back():
    core = core_with(Continuous(16), hello("continuous"))
    core.on_request(request(0), 0.0)
    core.schedule(0.0)
    core.on_worker_lost("w0", 1.0)
    core.on_hello("w0", hello("continuous"), 2.0)  # a hello: a restarted process, its batches gone
    assert core.on_back("w0", hello("continuous"), 3.0) == 0 and [r.request_id for r in core.queue] == [0]


def test_launches_that_were_never_sent_are_requeued_without_a_loss():
    core = core_with(Continuous(16), hello("continuous", worker_id="a"), hello("continuous", worker_id="b"))
    for rid in range(3):
        core.on_request(request(rid), 0.0)
    (launch,) = core.schedule(0.0).launches  # a gets 0, 1, 2 (it is asked first and has room)
    assert launch.worker_id == "a" and batches(launch) == {0: [0], 1: [1], 2: [2]}
    sent, unsent = launch.halves()  # its frames: batch 0's reached a, then a became unreachable
    assert batches(sent) == {0: [0]}
    core.on_send_failed([unsent], 1.0)
    assert "a" not in core.workers
    assert [(r.request_id, core.losses.get(r.request_id, 0)) for r in core.queue] == [(0, 1), (1, 0), (2, 0)]


def test_with_no_worker_left_queued_requests_wait_out_the_grace_then_fail():
    core = core_with(Naive(8), hello("static"))
    core.on_request(request(0), 0.0)
    core.on_worker_lost("w0", 1.0)
    deadline = 1.0 + WORKER_REJOIN_GRACE_S
    assert core.schedule(2.0).wake_at == deadline  # the core asks to be woken when the grace runs out
    core.tick(deadline - 0.5)
    assert [r.request_id for r in core.queue] == [0]
    core.tick(deadline)
    assert failures(core) == {0: "worker lost: no worker left"}
    assert not core.on_request(request(1), deadline + 1)  # later arrivals fail at once
    assert failures(core) == {1: "worker lost: no worker left"}


def test_a_worker_joining_within_the_grace_gets_the_queue():
    core = core_with(Naive(1), hello("static"))
    core.on_request(request(0), 0.0)
    core.on_worker_lost("w0", 1.0)
    core.on_hello("w1", hello("static", worker_id="w1"), 5.0)
    core.tick(1.0 + WORKER_REJOIN_GRACE_S)
    assert launched(core.schedule(20.0)) == [[0]] and not failures(core)


def test_the_core_is_done_only_after_the_stream_ended_and_nothing_waits_or_runs():
    core = core_with(Naive(1), hello("static"))
    core.on_request(request(0), 0.0)
    core.end_of_stream()
    assert not core.done()
    (launch,) = core.schedule(0.0).launches
    assert not core.done()
    core.on_batch_done("w0", launch.rows[0].batch_id, False, 1.0)
    assert core.done()


# --- every request ends exactly once ------------------------------------------------------------------
REQUEST = st.tuples(st.just("request"), st.integers(1, 50), st.integers(1, 20))
EVENTS = st.one_of(
    REQUEST, REQUEST, REQUEST,  # arrivals are the commonest event
    st.tuples(st.just("done"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("done"), st.integers(0, 30), st.just(False)),
    st.tuples(st.just("hello"), st.sampled_from(["a", "b", "c"]), st.sampled_from(["static", "continuous"])),
    st.tuples(st.just("lost"), st.sampled_from(["a", "b", "c"]), st.none()),
    st.tuples(st.just("back"), st.sampled_from(["a", "b", "c"]), st.none()),
    st.tuples(st.just("capacity"), st.sampled_from(["a", "b", "c"]), st.integers(0, 6)),
    st.tuples(st.just("send_failed"), st.integers(0, 30), st.none()),
    st.tuples(st.just("wait"), st.floats(0.0, 2 * WORKER_REJOIN_GRACE_S), st.none()),
)
EVENTS_LIST = st.lists(EVENTS, min_size=5, max_size=80)
FIRST_WORKERS = st.lists(st.tuples(st.just("hello"), st.sampled_from(["a", "b", "c"]),
                                   st.sampled_from(["static", "continuous"])), min_size=1, max_size=3)


class Tracker:
    """Plays events into a core and keeps each request's terminal outcomes."""

    def __init__(self, policy, max_queue: int) -> None:
        self.core = SchedulerCore(policy, max_queue=max_queue, max_queue_tokens=400)
        self.t, self.next_id = 0.0, 0
        self.ends: dict[int, list[str]] = {}
        self.running: dict[int, tuple[str, list[int]]] = {}  # batch_id -> (worker, request ids)
        self.silent: dict[str, WorkerHello] = {}  # workers lost for their silence (they may come back)
        self.last_launches = []  # the latest schedule's, which a send may fail

    def play(self, kind: str, a, b) -> None:
        core = self.core
        if kind == "request":
            core.on_request(RequestMsg(self.next_id, self.t, self.t, a, b), self.t)
            self.ends[self.next_id] = []
            self.next_id += 1
        elif kind == "done" and self.running:
            batch_id = sorted(self.running)[a % len(self.running)]
            self._done(batch_id, oom=b)
        elif kind == "hello":
            core.on_hello(a, WorkerHello(a, "sim", "fake", b, 4, 1, 200, "cpu", "none"), self.t)
        elif kind == "lost":
            if a in core.workers:
                self.silent[a] = core.workers[a].hello
            core.on_worker_lost(a, self.t)
        elif kind == "back" and a in self.silent and a not in core.workers:
            core.on_back(a, self.silent.pop(a), self.t)
            for batch_id, group in core.workers[a].inflight.items():  # what it still runs is its own again
                self.running[batch_id] = (a, [r.request_id for r in group])
        elif kind == "capacity":
            core.on_capacity(a, b)
        elif kind == "send_failed" and self.last_launches:
            launch = self.last_launches[a % len(self.last_launches)]
            ids = [b for b in launch.batch_ids() if b in self.running]
            if ids:  # its frames from this batch on never reached the worker
                first = ids[a % len(ids)]
                rows = [r for r in launch.rows if r.batch_id >= first and r.batch_id in self.running]
                core.on_send_failed([dataclasses.replace(launch, rows=rows)], self.t)
        elif kind == "wait":
            self.t += a
            core.tick(self.t)
        self._forget_lost_batches()
        self.schedule()

    def schedule(self) -> None:
        self.last_launches = self.core.schedule(self.t).launches
        for launch in self.last_launches:
            for batch_id, rids in batches(launch).items():
                self.running[batch_id] = (launch.worker_id, rids)
        self._collect()

    def _done(self, batch_id: int, oom: bool) -> None:
        wid, rids = self.running.pop(batch_id)
        batch = self.core.on_batch_done(wid, batch_id, oom, self.t)
        assert [r.request_id for r in batch] == rids
        if not oom:  # the worker decided each row's end (finished or failed in its BatchDone)
            for rid in rids:
                self.ends[rid].append("worker")

    def _forget_lost_batches(self) -> None:
        """Batches of workers the core no longer holds are gone with them (the core requeued or failed them)."""
        held = {b for w in self.core.workers.values() for b in w.inflight}
        for batch_id in [b for b in self.running if b not in held]:
            del self.running[batch_id]

    def _collect(self) -> None:
        for record in self.core.drain():
            self.ends[record.request_id].append(record.reason)

    def finish(self) -> None:
        """End the stream and run every batch to its end; with no worker left, the stop fails the rest."""
        self.core.end_of_stream()
        for _ in range(10_000):
            if self.core.done() or not self.core.workers:
                break
            self.t += 1.0
            if self.running:
                self._done(min(self.running), oom=False)
            self.schedule()
        self.core.fail_queue("scheduler stopped: interrupted", self.t)
        self._collect()


@settings(max_examples=300, deadline=None)
@given(first=FIRST_WORKERS, events=EVENTS_LIST, policy=st.sampled_from(["naive", "dynamic", "continuous"]),
       max_queue=st.integers(0, 6))
def test_every_submitted_request_ends_exactly_once(first, events, policy, max_queue):
    make = {"naive": lambda: Naive(3), "dynamic": lambda: Dynamic(4, 0.5, 8), "continuous": lambda: Continuous(4)}
    tracker = Tracker(make[policy](), max_queue)
    for event in first + events:
        tracker.play(*event)
        queued = [r.request_id for r in tracker.core.queue]
        inflight = [r.request_id for w in tracker.core.workers.values() for b in w.inflight.values() for r in b]
        assert len(set(queued + inflight)) == len(queued) + len(inflight)  # never in two places at once
        assert not set(queued + inflight) & {rid for rid, ends in tracker.ends.items() if ends}
    tracker.finish()
    assert not tracker.core.queue and not any(w.inflight for w in tracker.core.workers.values())
    assert {rid: len(ends) for rid, ends in tracker.ends.items()} == {rid: 1 for rid in tracker.ends}
    assert tracker.core.stats["submitted"] == tracker.next_id
