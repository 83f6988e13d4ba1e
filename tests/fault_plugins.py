"""Strategies for the fault tests, loaded by module path (tests.fault_plugins:Never)."""
from batchlab.scheduler.policies import Decision


class Never:
    """Launches nothing, ever: the run must end stalled, not hang."""

    name, mode = "never", "static"

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        """Wait, always."""
        return Decision()

    def on_batch_done(self, size: int, oom: bool) -> None:
        """Never called: nothing runs."""


class Crash(Never):
    """Raises on its first decision with a request in view: the scheduler dies mid-run, a fault no check before
    start can see (the check calls decide once on an empty queue, which this passes)."""

    name = "crash"

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        """Fail once there is something to decide about."""
        if not queue:
            return Decision()
        raise RuntimeError("this policy always fails")


class OverCap(Never):
    """Launches everything it is shown, whatever the worker's free rows: the core must cut it to them."""

    name = "over-cap"
    lookahead = 1_000  # shown more than a worker's rows

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        """All of it, now."""
        return Decision(n=len(queue), reason="over cap") if queue else Decision()
