"""A sweep runs again what a burst of other work disturbed (lab.disturbance), and only that: a neighbour that
stays for the whole sweep is reported, not chased."""
from batchlab.lab.disturbance import Disturbances
from batchlab.stats.interference import Interference


def record(other_cores: float, status: str = "done") -> dict:
    return {"status": status, "interference": Interference(2, 10.0, other_cores, other_cores, 1.0, 0.0, 20).as_dict()}


class Notes:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, line: str) -> None:
        self.lines.append(line)


def test_a_burst_beyond_the_usual_runs_again_and_says_so():
    d, notes = Disturbances(tries=1), Notes()
    for _ in range(3):
        assert "reran" not in d.run("quiet", lambda: record(0.05), notes)
    results = iter([record(1.1), record(0.04)])
    again = d.run("naive λ=4 rep 0", lambda: next(results), notes)
    assert again["reran"] == 1 and again["interference"]["other_cores"] == 0.04
    assert d.reran == notes.lines and "naive λ=4 rep 0: other work 1.10 of 2 cores" in notes.lines[0]
    assert "usual 0.05" in notes.lines[0] and "running it again" in notes.lines[0]


def test_a_neighbour_beside_every_run_is_not_chased_and_tries_are_bounded():
    d = Disturbances(tries=2)
    calls = []
    for _ in range(6):
        d.run("busy", lambda: calls.append(1) or record(1.0))
    assert len(calls) <= 6 + 2 * 2  # before three runs set the usual, a disturbed run may run again twice
    assert d.usual() == 1.0
    before = len(calls)
    d.run("busy", lambda: calls.append(1) or record(1.2))  # within the usual + 0.5: kept
    assert len(calls) == before + 1
    results = iter([record(1.9), record(1.9), record(1.9)])
    last = d.run("burst", lambda: next(results))
    assert last["reran"] == 2  # tries spent: the last run stands


def test_off_by_default_and_a_failed_or_unmetered_run_is_never_repeated():
    d = Disturbances()
    assert "reran" not in d.run("x", lambda: record(1.9)) and d.reran == []
    d = Disturbances(tries=3)
    assert d.run("failed", lambda: record(1.9, status="failed")).get("reran") is None
    assert d.run("unmetered", lambda: {"status": "done"}).get("reran") is None


def test_a_neighbour_there_before_the_sweep_is_its_usual_from_the_first_run():
    d = Disturbances(tries=1, baseline_cores=0.98)  # one CPU-bound process already running
    assert "reran" not in d.run("first", lambda: record(1.0)) and d.reran == []
    quiet_start = Disturbances(tries=1, baseline_cores=0.02)
    results = iter([record(1.0), record(0.03)])
    assert quiet_start.run("first", lambda: next(results))["reran"] == 1  # a burst since the sweep began


def test_the_background_is_read_before_a_sweep_only_when_it_may_rerun():
    assert Disturbances.measured(0).baseline_cores is None
    measured = Disturbances.measured(1)
    assert measured.tries == 1 and measured.baseline_cores is not None and measured.baseline_cores >= 0
