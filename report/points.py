"""Find and load the runs under a folder: a sweep (sweep.json + point folders) or one `batchlab run`."""
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa

from batchlab.protocol.outcomes import MEASURED, RunOutcome
from batchlab.collector.layout import (CAPACITY_FILE, FAILED_FILE, INDEX_FILE, PROBE_DIR, SATURATED_DIR, point_of,
                                       rate_of)
from batchlab.collector.parts import load_table, run_label
from batchlab.collector.summary import Summary, SummaryError, read_summary
from batchlab.protocol.errors import ReportError, RunRefused
from batchlab.protocol.run_dir import SUMMARY_FILE, TABLE_NAMES, RunDir
from batchlab.report.inputs import OPTIONAL, REQUIRED, check_capacity, inside, read_index, table_problem
from batchlab.report.pooling import PoolingError, refuse_mixed, split_mixed, unusable
from batchlab.report.tokens import TokenDigest, flags_for, frame_digest, read_digest
from batchlab.protocol.status import FailureReason, RequestStatus


@dataclass(slots=True)
class RunData:
    """One run's tables and summary (times in s since its t0)."""

    label: str
    rate: float
    repeat: int
    folder: Path
    summary: Summary
    requests: pd.DataFrame
    tokens: TokenDigest | pd.DataFrame  # load_run reads the digest; a frame given by hand is reduced when read
    batches: pd.DataFrame
    steps: pd.DataFrame

    @property
    def settings(self) -> dict:
        """The run's settings (RunConfig fields plus host facts and worker facts)."""
        return self.summary.settings

    def token_digest(self) -> TokenDigest:
        """The run's tokens as the report reads them (report.tokens)."""
        if isinstance(self.tokens, TokenDigest):
            return self.tokens
        return frame_digest(self.tokens, flags_for(self.requests, self.steps))


@dataclass(slots=True)
class FailedPoint:
    """A point of the sweep that did not complete, and why."""

    label: str
    rate: float
    repeat: int
    reason: str


@dataclass(slots=True)
class Collection:
    """Everything a report is made of."""

    root: Path
    runs: list[RunData] = field(default_factory=list)
    failed: list[FailedPoint] = field(default_factory=list)
    index: dict = field(default_factory=dict)

    @property
    def closed_loop(self) -> bool:
        """Every run is closed loop: each one's `rate` is then its clients (--concurrency)."""
        if self.index.get("concurrency"):
            return True
        return bool(self.runs) and all(r.settings.get("concurrency") for r in self.runs)

    def labels(self) -> list[str]:
        """Strategy labels in the order of the sweep's grid (else first seen)."""
        order = [e["label"] for e in self.index.get("entries", [])]
        seen = [r.label for r in self.runs] + [f.label for f in self.failed]
        return list(dict.fromkeys([*[o for o in order if o in seen], *seen]))

    def rates(self) -> list[float]:
        """Every rate with at least one completed run, ascending."""
        return sorted({r.rate for r in self.runs})

    def group(self, label: str, rate: float) -> list[RunData]:
        """The completed repeats of one strategy at one rate."""
        return [r for r in self.runs if r.label == label and r.rate == rate]

    def at_rate(self, rate: float) -> dict[str, list[RunData]]:
        """Each strategy's completed repeats at one rate, in label order (a strategy with none left out)."""
        return {label: runs for label in self.labels() if (runs := self.group(label, rate))}


def planned_rate(folder: Path, settings: dict) -> float:
    """The rate the sweep planned for a folder (its `rate=<r>` parent, or an old sweep's `rate-<r>`), else the
    run's --rate; 0 if none. Never a measured one: a point that measured nothing has no measured rate."""
    planned = rate_of(folder.parent)
    try:
        return planned if planned is not None else float(settings.get("rate") or 0.0)
    except ValueError:
        return 0.0


def own_trace_rate(summary: Summary) -> float:
    """A trace replayed at its own timing (--arrival trace, rate 0) plans the trace's mean rate in its
    window: the schedule's notes give it, else scheduled requests ÷ duration; 0 for anything else."""
    settings = summary.settings
    if settings.get("arrival") != "trace":
        return 0.0
    native = summary.schedule.get("trace_native_rate")
    duration_s, scheduled = settings.get("duration_s") or 0, summary.scheduled
    return float(native) if native else scheduled / duration_s if duration_s > 0 else 0.0


def load_run(folder: Path, label: str | None = None, repeat: int | None = None,
             rate: float | None = None) -> RunData:
    """A run folder's summary and tables; `rate` is the sweep's planned rate when the index gives it
    (a trace at its own timing: the trace's rate)."""
    summary = read_summary(folder)
    settings = summary.settings
    if repeat is None:
        point = point_of(folder)
        repeat = point[2] if point else 0
    tables = {name: _table(folder, name) for name in TABLE_NAMES if name != "tokens"}
    tables["tokens"] = _tokens(folder, flags_for(tables["requests"], tables["steps"]))
    pa.default_memory_pool().release_unused()  # Arrow keeps the read buffers for reuse: a report reads once
    if settings.get("concurrency"):  # closed loop: its load level is its clients (no planned rate)
        if not isinstance(settings["concurrency"], int):
            raise RunRefused(f"{RunDir(folder).summary}: settings.concurrency is not a number of clients")
        rate = float(settings["concurrency"])
    rate = planned_rate(folder, settings) if rate is None else float(rate)
    rate = rate if rate > 0 else own_trace_rate(summary) or rate
    return RunData(label or run_label(settings), rate, repeat, folder, summary, **tables)


def _table(folder: Path, name: str) -> pd.DataFrame:
    """A run's table, checked for the columns the report reads; RunRefused (one line) when it cannot be."""
    path = RunDir(folder).table(name)
    try:  # of the steps (a row per step: millions) only the columns the report reads
        df = (load_table(folder, name, columns=[*REQUIRED[name], *OPTIONAL[name]], categories=("worker",))
              if name == "steps" else load_table(folder, name))
    except (OSError, ValueError) as exc:  # pyarrow's errors on a file that is not Parquet are ValueErrors
        raise _unreadable(path, exc) from None
    problem = table_problem(name, df)
    if problem:
        raise RunRefused(f"{path}: {problem}")
    return df


def _tokens(folder: Path, flags) -> TokenDigest:
    """A run's tokens digest, each slice read checked as _table checks a table; RunRefused (one line) when it
    cannot be read."""
    path = RunDir(folder).table("tokens")

    def check(df: pd.DataFrame) -> None:
        problem = table_problem("tokens", df)
        if problem:
            raise RunRefused(f"{path}: {problem}")

    try:
        return read_digest(folder, check, flags)
    except (OSError, ValueError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: Exception) -> RunRefused:
    """The one line for a table file pyarrow could not read."""
    return RunRefused(f"{path}: cannot read it ({' '.join(str(exc).split()) or type(exc).__name__})")


def _first_error(requests: pd.DataFrame) -> str:
    """The first failure reason in the table, preferring a cause over 'not sent' (its consequence)."""
    if "error" not in requests or "status" not in requests:
        return "requests.parquet holds no failure reason"
    errors = [str(e) for e in requests.loc[requests["status"] != RequestStatus.FINISHED, "error"].dropna() if str(e)]
    causes = [e for e in errors if e != FailureReason.NOT_SENT]
    return (causes or errors or ["no failure reason recorded"])[0].splitlines()[0]


def emptiness(run: RunData) -> str | None:
    """Why a run measured nothing (no planned rate, or no finished request in a window), else None."""
    if not run.rate > 0:  # also NaN
        return "measured nothing: no planned rate"
    if run.summary.finished and run.summary.window_s > 0:
        return None
    return (f"measured nothing: {run.summary.finished} of {len(run.requests)} requests finished; "
            f"{_first_error(run.requests)}")


def _add(coll: "Collection", run: RunData, note: str = "") -> None:
    """A run that measured something joins the runs; one that measured nothing is a failed point."""
    why = emptiness(run)
    if why is None:
        coll.runs.append(run)
    else:
        coll.failed.append(FailedPoint(run.label, run.rate, run.repeat, why + (f" ({note})" if note else "")))


def index_load(point: dict) -> float:
    """A sweep.json point's load key: its clients (closed loop, rate null) or its planned rate."""
    return float(point["concurrency"]) if point.get("concurrency") else point["rate"]


def load_text(value: float, closed_loop: bool, unit: str = " req/s") -> str:
    """'λ = 5 req/s', or closed loop '4 clients'."""
    return f"{value:g} clients" if closed_loop else f"λ = {value:g}{unit}"


def _from_index(root: Path, index: dict, refused: list[str]) -> Collection:
    """The points sweep.json lists; a point folder outside `root` or unreadable is refused (its line)."""
    coll = Collection(root, index=index)
    for point in index.get("points", []):
        folder = root / point["dir"]
        if not inside(root, folder):
            refused.append(f"{root / 'sweep.json'}: the point {point['dir']!r} is not inside {root}; "
                           "the report pools only run folders within the folder it is given")
            continue
        if point["status"] in MEASURED and RunDir(folder).summary.exists():
            run = _guarded(refused, load_run, folder, point["label"], point["repeat"], index_load(point))
            if run is not None:
                _add(coll, run, (point.get("reason") or "").partition("\n")[0])
        elif point["status"] != RunOutcome.PENDING:
            reason = point.get("reason") or "no summary.json"
            coll.failed.append(FailedPoint(point["label"], index_load(point), point["repeat"], reason))
    return coll


def _guarded(refused: list[str], load, *args):
    """`load(*args)`, or None with its one line added to `refused` when the run's files are bad."""
    try:
        return load(*args)
    except (SummaryError, RunRefused) as exc:
        refused.append(str(exc))
        return None


def _scanned(root: Path, summary: Path) -> RunData | FailedPoint | None:
    """One folder found by the scan: a run, a failed point, or None (a burst's or a saturated run's)."""
    folder = summary.parent
    if {PROBE_DIR, SATURATED_DIR} & set(folder.relative_to(root).parts):
        return None
    why = (folder / FAILED_FILE).read_text().strip() if (folder / FAILED_FILE).exists() else unusable(folder)
    if why:
        settings = read_summary(folder).settings
        point = point_of(folder)
        label = point[0] if point and (folder / FAILED_FILE).exists() else run_label(settings)
        return FailedPoint(label, planned_rate(folder, settings), 0, why)
    point = point_of(folder.relative_to(root))
    return load_run(folder, point[0] if point else None)


def _from_scan(root: Path, refused: list[str]) -> Collection:
    """No index: every folder below root with a summary.json (bursts and saturated runs excluded) is a run."""
    coll = Collection(root)
    for summary in sorted(root.rglob(SUMMARY_FILE)):
        if not inside(root, summary):
            refused.append(f"{summary}: a link to a run outside {root}; the report pools only run folders within it")
            continue
        found = _guarded(refused, _scanned, root, summary)
        if isinstance(found, FailedPoint):
            coll.failed.append(found)
        elif found is not None:
            _add(coll, found)
    return coll


def load_collection(root: str | Path) -> Collection:
    """A sweep folder (via sweep.json) or any folder holding run folders or being one. Every file it
    cannot take is a line of one ReportError: a report is made of every run or of none."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    index_path, refused = root / INDEX_FILE, []
    try:
        index = read_index(index_path) if index_path.exists() else None
        if (root / CAPACITY_FILE).exists():  # read by report.capacities
            check_capacity(root / CAPACITY_FILE)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    coll = _from_scan(root, refused) if index is None else _from_index(root, index, refused)
    if refused:
        raise ReportError(*refused)
    try:
        refuse_mixed(coll.runs) if index_path.exists() else split_mixed(coll.runs)
    except PoolingError as exc:
        raise ReportError(str(exc)) from None
    if not coll.runs and not coll.failed:
        raise ReportError(f"{root} holds no run (no {SUMMARY_FILE} and no {INDEX_FILE})")
    return coll
