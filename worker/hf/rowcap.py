"""The continuous HF loop's row cap (worker.hf.continuous): halved by an out-of-memory, probed back up after
clean steps, as the static back-off does (scheduler.policies); the worker reports every change."""
from dataclasses import dataclass


@dataclass(slots=True)
class RowCap:
    """Rows run at once: halved by an OOM (min 1), +1 after `probe_steps` clean steps, up to `limit`."""

    limit: int  # the cap announced at hello
    probe_steps: int  # clean steps before the cap rises by one (continuous.CLEAN_STEPS_TO_PROBE)
    rows: int = 0
    reason: str = "announced"
    clean_steps: int = 0
    oom_in_step: bool = False

    def __post_init__(self) -> None:
        self.rows = self.rows or self.limit

    def halve(self, rows_at_oom: int) -> None:
        """An OOM with `rows_at_oom` rows in the forward (rows over the cap never raise it)."""
        self.rows = max(1, min(self.rows, rows_at_oom) // 2)
        self.reason = f"out of memory with {rows_at_oom} rows"
        self.clean_steps, self.oom_in_step = 0, True

    def end_step(self) -> None:
        """Count a finished step; enough in a row without an OOM probe the cap up by one."""
        if self.oom_in_step:
            self.oom_in_step = False
            return
        self.clean_steps += 1
        if self.clean_steps >= self.probe_steps and self.rows < self.limit:
            self.rows, self.clean_steps = self.rows + 1, 0
            self.reason = f"probe: {self.probe_steps} steps without an out-of-memory"
