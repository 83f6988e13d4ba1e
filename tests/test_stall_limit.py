"""The stall limit (SchedulerCore, pure): once the stream ended, requests that wait on idle workers for
stall_limit_s fail with a reason that says so; a policy that launches, or a busy worker, is not stalled."""
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.policies import Decision, Naive
from tests.test_core import core_with, failures, hello, request


class Never:
    """A plugin-like policy that never launches anything."""

    name, mode = "never", "static"

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        return Decision()

    def on_batch_done(self, size: int, oom: bool) -> None:
        pass


def stalled_core(limit_s: float = 5.0) -> SchedulerCore:
    core = core_with(Never(), hello("static"), stall_limit_s=limit_s)
    for rid in range(3):
        core.on_request(request(rid), 0.0)
    return core


def test_queued_requests_on_idle_workers_fail_as_stalled_once_the_limit_passed_after_the_stream_ended():
    core = stalled_core()
    core.end_of_stream()
    core.tick(1.0)  # the idle time counts from here
    core.tick(5.9)
    assert failures(core) == {}
    core.tick(6.0)
    reasons = failures(core)
    assert sorted(reasons) == [0, 1, 2]
    assert set(reasons.values()) == {"stalled: policy launched nothing for 5 s with 3 queued and every worker idle"}
    assert core.done() and core.stats["stalled"] == 3


def test_no_stall_before_the_stream_ended_nor_with_the_limit_off():
    core = stalled_core()
    for t in (1.0, 100.0, 1000.0):
        core.tick(t)
    assert failures(core) == {}
    off = stalled_core(limit_s=0.0)
    off.end_of_stream()
    for t in (1.0, 1000.0):
        off.tick(t)
    assert failures(off) == {}


def test_a_launch_restarts_the_idle_time_and_a_busy_worker_is_not_stalled():
    core = core_with(Naive(2), hello("static"), stall_limit_s=5.0)
    for rid in range(3):
        core.on_request(request(rid), 0.0)
    core.end_of_stream()
    core.tick(0.0)
    assert [len(launch.requests) for launch in core.schedule(4.0).launches] == [2]
    core.tick(20.0)  # request 2 waits, but the worker runs the batch
    assert failures(core) == {}
    core.on_batch_done("w0", 0, False, 21.0)
    core.tick(21.0)
    core.schedule(21.0)  # naive flushes the leftover once the stream ended
    core.tick(40.0)
    assert failures(core) == {}
