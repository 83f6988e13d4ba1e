"""runner.outcome: a run's exit code and its one line, from the summary's failure reasons and the roles'
deaths (faults are non-zero; the run's own rules, such as a full queue or a deadline, are results)."""
import errno
import signal

import pytest

from batchlab.runner.outcome import FAULT_EXIT, death_line, exception_line, exit_code_for, is_fault, verdict
from tests.summaries import make_summary


@pytest.mark.parametrize("reason", ["worker lost: no worker left", "no terminal record: run ended before it completed",
                                    "not sent: traffic stopped before its planned time", "scheduler stopped: interrupted",
                                    "worker stopped before the request finished", "worker error: RuntimeError: x",
                                    "worker rejoined: its running requests were lost",
                                    "stalled: policy launched nothing for 60 s with 3 queued and every worker idle"])
def test_failures_caused_by_a_fault_are_faults(reason):
    assert is_fault(reason)


@pytest.mark.parametrize("reason", ["queue full", "deadline", "rejected by the strategy",
                                    "out of memory: does not fit alone", "too long for my plugin"])
def test_failures_by_the_runs_own_rules_are_results(reason):
    assert not is_fault(reason)


def test_a_run_whose_failures_are_all_results_exits_0():
    assert verdict(make_summary(scheduled=10, failure_reasons={"queue full": 4, "deadline": 2}), []) == (0, "")
    assert verdict(make_summary(scheduled=10, failure_reasons={}), []) == (0, "")


def test_requests_lost_to_a_fault_exit_non_zero_naming_the_biggest_cause_and_the_count():
    reasons = {"worker lost: no worker left": 198, "queue full": 3}
    code, line = verdict(make_summary(scheduled=216, failure_reasons=reasons), [])
    assert code == FAULT_EXIT and line == "worker lost: no worker left; 198 of 216 requests lost to faults"


def test_a_stalled_policy_is_named_first_even_when_another_fault_failed_more():
    stalled = "stalled: policy launched nothing for 60 s with 5 queued and every worker idle"
    code, line = verdict(make_summary(scheduled=20, failure_reasons={"not sent: x": 9, stalled: 5}), [])
    assert code == FAULT_EXIT and line.startswith(stalled + "; 14 of 20 requests lost") and "2 fault reasons" in line


def test_a_role_death_comes_first_even_when_no_request_was_lost():
    code, line = verdict(make_summary(scheduled=5), ["worker-1 killed by SIGKILL mid-run; see its log"])
    assert code == FAULT_EXIT and line == "worker-1 killed by SIGKILL mid-run; see its log"
    assert verdict(None, []) == (FAULT_EXIT, "the collector wrote no summary")


def test_a_full_disk_is_named_from_the_collectors_exit_code():
    code = exit_code_for(OSError(errno.ENOSPC, "No space left on device"))
    assert code == errno.ENOSPC
    assert death_line("collector", code) == "collector could not write: No space left on device"
    assert exit_code_for(RuntimeError("bug")) == 1 and exit_code_for(OSError("no errno")) == 1


def test_a_death_line_says_how_the_role_ended():
    assert death_line("worker-0", -signal.SIGKILL).startswith("worker-0 killed by SIGKILL mid-run")
    assert death_line("scheduler", 128 + signal.SIGTERM).startswith("scheduler stopped by SIGTERM mid-run")
    assert death_line("worker-0", 1).startswith("worker-0 died (exit code 1)")
    assert death_line("worker-0", 5) == "worker-0 died: Input/output error"


def test_a_role_lost_before_the_traffic_started_is_said_to_be_lost_during_start_up():
    assert death_line("worker-0", -signal.SIGKILL, started=False).startswith("worker-0 killed by SIGKILL during "
                                                                             "start-up")
    assert death_line("worker-1", 128 + signal.SIGTERM, started=False).startswith("worker-1 stopped by SIGTERM "
                                                                                  "during start-up")


def test_a_crashed_role_is_named_with_its_exception():
    cause = exception_line(RuntimeError("this policy\n always fails"))
    assert cause == "RuntimeError: this policy always fails"
    assert death_line("scheduler", 1, cause=cause).startswith("scheduler crashed mid-run: RuntimeError: this "
                                                              "policy always fails")
    assert death_line("scheduler", 1).startswith("scheduler died (exit code 1)")  # it wrote none
    assert death_line("collector", errno.ENOSPC, cause=cause) == "collector could not write: No space left on device"
    assert len(exception_line(ValueError("x" * 10_000))) <= 300 and exception_line(KeyError()) == "KeyError"


class _Ended:
    """A role's process that has already ended with `exitcode` (what the launcher's watch polls)."""

    def __init__(self, exitcode: int) -> None:
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return False


def test_a_scheduler_that_ended_within_one_poll_of_the_collector_is_still_named(tmp_path):
    """A SIGTERM to the scheduler while the run drains: on a loaded machine the collector can end before the
    launcher's next poll, so both are seen ended at once; the scheduler's exit code is still read (the
    fault matrix's scheduler-TERM-draining cell printed 'scheduler stopped: interrupted' instead)."""
    import multiprocessing as mp

    from batchlab.runner.launcher import RunFailed, _Clock, _Faults, _watch
    from batchlab.runner.procs import Child

    started = mp.get_context("spawn").Event()
    started.set()
    own = [Child("traffic", _Ended(0)), Child("scheduler", _Ended(128 + signal.SIGTERM)),
           Child("collector", _Ended(0))]
    ctx = mp.get_context("spawn")
    faults = _Faults(ctx.Event(), ctx.Value("i", 0), ctx.Value("d", 0.0))
    with pytest.raises(RunFailed, match="scheduler stopped by SIGTERM mid-run"):
        _watch(own, [], None, None, _Clock(None, started, tmp_path), faults, 30.0)
    assert faults.deaths == [death_line("scheduler", 128 + signal.SIGTERM)]
    clean = [Child(c.name, _Ended(0)) for c in own]
    _watch(clean, [], None, None, _Clock(None, started, tmp_path), _Faults(mp.Event(), mp.Value("i", 0),
                                                                          mp.Value("d", 0.0)), 30.0)
