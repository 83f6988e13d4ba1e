"""Names of the files in a run folder (written by traffic, the collector and the launcher, read by the
report, the simulator, tune and the benchmarks): every path of one goes through RunDir."""
from dataclasses import dataclass
from pathlib import Path

TABLE_NAMES = ("requests", "tokens", "batches", "steps")  # a run's tables: <name>.parquet
SUMMARY_FILE = "summary.json"
SCHEDULE_FILE = "schedule.parquet"  # traffic's planned requests (replayable)
NOTES_KEY = b"batchlab.notes"  # schedule.parquet's footer key: the schedule's notes as JSON
PARTS_DIR = ".parts"  # a live run's table rows, one Parquet file per flush
GAPS_FILE = "itl.f64"  # under PARTS_DIR: the finished requests' inter-token gaps, raw float64 (collector.merge)
LOGS_DIR = "logs"  # every role's stdout/stderr
CONFIG_FILE = "config.yaml"  # the run's settings, as `--config` reads them
PIDS_FILE = "pids.json"  # every role's process id while a run goes
TIMING_FILE = "timing.json"  # start-up and run seconds (launcher)
PROGRESS_FILE = "progress.json"  # request counts while a run goes (collector → launcher)
RUN_FILE = "run.json"  # a run's identity (config hash), environment, start/end and status
VLLM_RESULT_FILE = "vllm_result.json"  # a run's figures under `vllm bench serve --save-result`'s keys
VLLM_RESULT_ERROR_FILE = "vllm_result.error.txt"  # why a sweep point has no vllm_result.json


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

    def parts(self, name: str) -> list[Path]:
        """A table's part files, in the order they were written."""
        return sorted((self.path / PARTS_DIR).glob(f"{name}-*.parquet"))

    def log(self, name: str) -> Path:
        """A role's output file."""
        return self.path / LOGS_DIR / name

    summary = property(lambda self: self.path / SUMMARY_FILE)
    schedule = property(lambda self: self.path / SCHEDULE_FILE)
    progress = property(lambda self: self.path / PROGRESS_FILE)
    run = property(lambda self: self.path / RUN_FILE)
    parts_dir = property(lambda self: self.path / PARTS_DIR)
    logs = property(lambda self: self.path / LOGS_DIR)
    vllm_result = property(lambda self: self.path / VLLM_RESULT_FILE)
    vllm_result_error = property(lambda self: self.path / VLLM_RESULT_ERROR_FILE)
    config = property(lambda self: self.path / CONFIG_FILE)
    pids = property(lambda self: self.path / PIDS_FILE)
    timing = property(lambda self: self.path / TIMING_FILE)
    gaps = property(lambda self: self.path / PARTS_DIR / GAPS_FILE)
