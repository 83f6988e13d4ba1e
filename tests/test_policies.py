"""Policy table tests: the five-request example, naive's flush, the memory trigger, the adaptive cap."""
import pytest

from batchlab.protocol import RequestMsg
from batchlab.scheduler.policies import Capacity, Continuous, Dynamic, Naive, fit_padded

# The five-request example: room for 4 rows; arrivals at steps 0, 1, 5, 6, 7 needing 6, 3, 4, 2, 5 decode steps.
ARRIVALS = [0, 1, 5, 6, 7]
NEEDS = [6, 3, 4, 2, 5]
NAMES = "ABCDE"
ROOM = 4
BIG = 10**15


def drive_static(policy, horizon: int = 40) -> list[tuple[int, str, str, int]]:
    """Step-time driver: one lockstep batch at a time; returns (launch step, names, reason, end step)."""
    queue, launches, busy_until = [], [], 0
    for t in range(horizon):
        queue += [RequestMsg(i, ARRIVALS[i], ARRIVALS[i], 1, NEEDS[i]) for i in range(5) if ARRIVALS[i] == t]
        free = ROOM if t >= busy_until else 0
        d = policy.decide(queue, t, Capacity(free, BIG, 1, t >= busy_until), t >= ARRIVALS[-1])
        if d.n:
            batch, queue = queue[: d.n], queue[d.n:]
            busy_until = t + max(r.output_len for r in batch)
            launches.append((t, "".join(NAMES[r.request_id] for r in batch), d.reason, busy_until))
    return launches


def test_naive_waits_for_four_then_flushes_the_leftover_at_end_of_stream():
    assert drive_static(Naive(batch_size=4)) == [(6, "ABCD", "size", 12), (12, "E", "flush", 17)]


def test_dynamic_launches_on_age_after_two_steps():
    assert drive_static(Dynamic(max_batch_size=4, max_wait_s=2, max_new_tokens=8)) == [
        (2, "AB", "age", 8), (8, "CDE", "age", 13)]


def test_continuous_starts_each_request_when_it_arrives_and_frees_it_when_done():
    policy, running, queue, spans = Continuous(max_batch_size=ROOM), {}, [], {}
    for t in range(20):
        for rid in [r for r, end in running.items() if end <= t]:
            del running[rid]
        queue += [RequestMsg(i, ARRIVALS[i], ARRIVALS[i], 1, NEEDS[i]) for i in range(5) if ARRIVALS[i] == t]
        d = policy.decide(queue, t, Capacity(ROOM - len(running), BIG, 1, not running), False)
        for r in queue[: d.n]:
            running[r.request_id] = t + r.output_len
            spans[NAMES[r.request_id]] = (t, t + r.output_len)
        queue = queue[d.n:]
    assert spans == {"A": (0, 6), "B": (1, 4), "C": (5, 9), "D": (6, 8), "E": (7, 12)}


def test_dynamic_asks_to_be_woken_when_the_oldest_request_turns_stale():
    d = Dynamic(8, 0.05, 16).decide([RequestMsg(0, 1.0, 1.0, 10, 10)], 1.01, Capacity(8, BIG, 1, True), False)
    assert (d.n, d.wake_at) == (0, pytest.approx(1.05))


def test_busy_worker_gets_nothing_from_any_policy():
    q = [RequestMsg(i, 0.0, 0.0, 5, 5) for i in range(10)]
    busy = Capacity(0, BIG, 1, False)
    for policy in (Naive(4), Dynamic(4, 0.0, 8), Continuous(4)):
        assert policy.decide(q, 100.0, busy, True).n == 0


def test_memory_trigger_stops_at_the_first_request_over_budget():
    # padded cost of k rows: k × (P_max + 10) × 1 byte; prompts 10, 10, 50: 2 rows cost 40, 3 rows cost 180
    q = [RequestMsg(0, 0.0, 0.0, 10, 5), RequestMsg(1, 0.0, 0.0, 10, 5), RequestMsg(2, 0.0, 0.0, 50, 5)]
    cap = Capacity(8, 100, 1, True)
    assert fit_padded(q, 8, cap, max_new_tokens=10) == 2
    d = Dynamic(8, 1.0, 10).decide(q, 0.0, cap, False)
    assert (d.n, d.reason) == (2, "memory")


def test_memory_trigger_always_lets_one_request_through():
    q = [RequestMsg(0, 0.0, 0.0, 1000, 5), RequestMsg(1, 0.0, 0.0, 10, 5)]
    d = Dynamic(8, 1.0, 10).decide(q, 0.0, Capacity(8, 1, 1, True), False)
    assert (d.n, d.reason) == (1, "memory")


def test_oom_halves_the_cap_and_twenty_clean_batches_probe_it_up_by_one():
    policy = Dynamic(16, 0.0, 8)
    policy.on_batch_done(16, oom=True)
    assert policy.cap == 8
    policy.on_batch_done(8, oom=True)
    policy.on_batch_done(4, oom=True)
    policy.on_batch_done(2, oom=True)
    policy.on_batch_done(1, oom=True)
    assert policy.cap == 1
    for _ in range(19):
        policy.on_batch_done(1, oom=False)
    assert policy.cap == 1
    policy.on_batch_done(1, oom=False)
    assert policy.cap == 2
    q = [RequestMsg(i, 0.0, 0.0, 5, 5) for i in range(10)]
    assert policy.decide(q, 1.0, Capacity(16, BIG, 1, True), False).n == 2


def test_continuous_admits_within_the_kv_budget_but_never_starves_an_idle_worker():
    q = [RequestMsg(0, 0.0, 0.0, 60, 40), RequestMsg(1, 0.0, 0.0, 10, 10)]
    assert Continuous(8).decide(q, 0.0, Capacity(8, 50, 1, False), False).n == 0
    assert Continuous(8).decide(q, 0.0, Capacity(8, 50, 1, True), False).n == 1
    assert Continuous(8).decide(q, 0.0, Capacity(8, 120, 1, False), False).n == 2


def test_naive_shrinks_to_the_halved_cap_after_an_oom_so_it_can_progress():
    policy = Naive(batch_size=8)
    q = [RequestMsg(i, 0.0, 0.0, 5, 5) for i in range(8)]
    policy.on_batch_done(8, oom=True)
    assert policy.decide(q, 1.0, Capacity(8, BIG, 1, True), False).n == 4
    assert policy.decide(q[:3], 1.0, Capacity(8, BIG, 1, True), False).n == 0
