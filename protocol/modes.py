"""How a worker batches, a closed set: on the wire (WorkerHello.mode, as its text) and in files (a calibration's
record, a run's worker facts) by value, so the values written stay "static" and "continuous"."""
from enum import StrEnum


class BatchingMode(StrEnum):
    """A worker's batching: whole batches one at a time, or requests joining at step boundaries."""

    STATIC = "static"  # one batch at a time: a batch ends before the next starts
    CONTINUOUS = "continuous"  # requests join and leave the running batch at step boundaries
