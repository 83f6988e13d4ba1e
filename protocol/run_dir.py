"""Names of the files in a run folder (written by traffic, the collector and the launcher, read by the
report, the simulator, tune and the benchmarks): every path of one goes through RunDir."""
import json
from dataclasses import dataclass
from pathlib import Path

TABLE_NAMES = ("requests", "tokens", "batches", "steps")  # a run's tables: <name>.parquet
SUMMARY_FILE = "summary.json"  # the run's figures (collector.summary.Summary)
SCHEDULE_FILE = "schedule.parquet"  # traffic's planned requests (replayable)
NOTES_KEY = b"batchlab.notes"  # schedule.parquet's footer key: the schedule's notes as JSON
PARTS_DIR = ".parts"  # a live run's table rows, one Parquet file per flush
LOGS_DIR = "logs"  # every role's stdout/stderr
RUN_FILE = "run.json"  # a run's identity (config hash), environment, start/end and status


def footer_notes(footer: dict[bytes, bytes]) -> dict:
    """The schedule's notes from schedule.parquet's footer metadata ({} if absent or unreadable)."""
    try:
        notes = json.loads(footer.get(NOTES_KEY, b"{}"))
    except ValueError:
        return {}
    return notes if isinstance(notes, dict) else {}


@dataclass(frozen=True, slots=True)
class RunDir:
    """One run's folder: the path of every file in it."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    def table(self, name: str) -> Path:
        """A final table file: requests, tokens, batches or steps."""
        return self.path / f"{name}.parquet"

    def part(self, name: str, seq: int) -> Path:
        """A table's `seq`-th part file."""
        return self.path / PARTS_DIR / f"{name}-{seq:06d}.parquet"

    def crash(self, role: str) -> Path:
        """One line: the exception that ended a role's process (the launcher names it in its verdict)."""
        return self.path / LOGS_DIR / f"{role}.crash"

    def parts(self, name: str) -> list[Path]:
        """A table's part files, in the order they were written."""
        return sorted((self.path / PARTS_DIR).glob(f"{name}-*.parquet"))

    summary = property(lambda self: self.path / SUMMARY_FILE)
    schedule = property(lambda self: self.path / SCHEDULE_FILE)
    run = property(lambda self: self.path / RUN_FILE)
    parts_dir = property(lambda self: self.path / PARTS_DIR)
    logs = property(lambda self: self.path / LOGS_DIR)
    gaps = property(lambda self: self.path / PARTS_DIR / "itl.f64")  # finished requests' inter-token gaps, float64
    progress = property(lambda self: self.path / "progress.json")  # request counts while a run goes
    config = property(lambda self: self.path / "config.yaml")  # the run's settings, as --config reads them
    pids = property(lambda self: self.path / "pids.json")  # every role's process id while a run goes
    timing = property(lambda self: self.path / "timing.json")  # start-up and run seconds (launcher)
    vllm_result = property(lambda self: self.path / "vllm_result.json")  # vllm bench serve's result keys
    vllm_result_error = property(lambda self: self.path / "vllm_result.error.txt")  # why there is none
