"""How a run or a sweep point ended: the closed set of statuses run.json and sweep.json hold, as one enum.

A member is its string (a StrEnum): written into JSON it is the same text as ever, and a status read back
from an older file compares equal to its member, so old folders still read."""
from enum import StrEnum


class RunOutcome(StrEnum):
    """A run's status in run.json, and a sweep point's in sweep.json."""

    PENDING = "pending"  # sweep.json: a point planned, not yet run
    RUNNING = "running"  # run.json while the run goes (a launcher that died leaves it so)
    DONE = "done"  # the run ended and its tables are written
    FAILED = "failed"  # a role died, a fault lost requests, or it could not start
    STOPPED = "stopped"  # a limit ended its traffic: what finished is kept
    INTERRUPTED = "interrupted"  # Ctrl-C or a stop signal
    SKIPPED = "skipped"  # a sweep point measured before, kept when the sweep resumed


MEASURED = (RunOutcome.DONE, RunOutcome.SKIPPED)  # a sweep point's statuses whose folder holds what it measured
