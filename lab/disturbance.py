"""Runs that a burst of other work disturbed, run again: a sweep's points, saturated runs and probes (each
run's summary.json `interference`, stats.interference). A neighbour that stays for the whole sweep bends
every run alike and is reported, not chased: only a run disturbed beyond the sweep's usual background
(stats.interference.is_burst, against the median of the runs so far, or before three runs the background
read just before the sweep) runs again, at most `tries` times, and the sweep says that it did (the view's
note, sweep.json's `reran`)."""
import statistics
from collections.abc import Callable

from batchlab.protocol.outcomes import RunOutcome
from batchlab.stats.interference import is_burst, read

MIN_USUAL = 3  # runs seen before their median counts as the sweep's usual background
BASELINE_S = 2.0  # before a sweep that reruns disturbed runs, the machine's background is read this long


class Disturbances:
    """The other work beside a sweep's runs so far, and the runs it ran again."""

    def __init__(self, tries: int = 0, baseline_cores: float | None = None) -> None:
        self.tries = tries
        self.baseline_cores = baseline_cores  # the machine's background before the sweep (None: not read)
        self.seen: list[float] = []  # every metered run's other work (cores)
        self.reran: list[str] = []  # one line per run measured again

    @classmethod
    def measured(cls, tries: int) -> "Disturbances":
        """Disturbances for `tries`; with tries, the machine's background read for BASELINE_S first (its
        usual until MIN_USUAL runs have been seen: a neighbour there from the start is not a burst)."""
        if not tries:
            return cls(0)
        import time

        from batchlab.runner.cpu_meter import CpuMeter

        meter = CpuMeter().start()
        time.sleep(BASELINE_S)
        found = meter.stop()
        return cls(tries, found.other_cores if found is not None else None)

    def usual(self) -> float | None:
        """The sweep's usual other work (cores): the median of its runs so far, or before MIN_USUAL runs the
        background read before the sweep; None when neither is known."""
        return statistics.median(self.seen) if len(self.seen) >= MIN_USUAL else self.baseline_cores

    def run(self, name: str, once: Callable[[], dict], view=None) -> dict:
        """`once()` (a run's record, with its `interference`), again while a burst disturbed it and tries are
        left; the last record, marked with how many times it ran again."""
        for attempt in range(self.tries + 1):
            record = once()
            found = read(record.get("interference")) if record.get("status") == RunOutcome.DONE else None
            usual = self.usual()
            if found is not None:
                self.seen.append(found.other_cores)
            if attempt == self.tries or not is_burst(found, usual):
                return record | ({"reran": attempt} if attempt else {})
            line = (f"{name}: {found.text()} beside it (usual "
                    f"{'not known yet' if usual is None else f'{usual:.2f}'}): running it again")
            self.reran.append(line)
            if view is not None:
                view.note(line)
        return record
