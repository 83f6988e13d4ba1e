"""Find and load the runs under a folder: a sweep (sweep.json + point folders) or one `batchlab run`.

What the report accepts from a folder it is given: sweep.json's index as a typed model, each table's
required columns and their kinds, and run folders only inside the folder. A file that fails is named
with what is wrong in one line (never a traceback); load_collection gathers those lines.

Kinds are loose on purpose: a "number" column may hold ints or floats (NaN is a missing value), a
"text" column strings, a "flag" column booleans; whatever else a table holds is not read.

Which runs belong together: repeats of one point only when their configurations are equal but for
the seed, one curve only when they are equal but for seed and rate (protocol.identity).

A folder of loose runs (no sweep index) that share a label but differ in anything else is split into
separate curves, each labelled with the settings that tell them apart; a sweep whose points differ
within one label (data measured under another configuration) is refused, naming the keys.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, NonNegativeInt, ValidationError

from batchlab.collector.layout import (CAPACITY_FILE, FAILED_FILE, INDEX_FILE, PROBE_DIR, SATURATED_DIR, point_of,
                                       rate_of)
from batchlab.collector.metrics import NOT_SENT
from batchlab.collector.parts import load_table, run_label
from batchlab.collector.summary import Summary, SummaryError, read_summary
from batchlab.protocol.identity import differences, identity
from batchlab.protocol.run_dir import SUMMARY_FILE, TABLE_NAMES, RunDir
from batchlab.protocol.setting_groups import BatchlabError

Kind = Literal["number", "text", "flag"]
REQUIRED: dict[str, dict[str, Kind]] = {  # a table present must have these columns, of these kinds
    "requests": {"request_id": "number", "status": "text", "output_len": "number", "arrival_time": "number",
                 "scheduled_time": "number", "first_token_time": "number", "completion_time": "number",
                 "n_tokens": "number"},
    "tokens": {"request_id": "number", "token_index": "number", "time": "number"},
    "batches": {"start_time": "number", "completion_time": "number", "size": "number"},
    "steps": {"start_time": "number", "end_time": "number", "running": "number"},
}
OPTIONAL: dict[str, dict[str, Kind]] = {  # read when present: then of these kinds
    "requests": {"error": "text", "submitted": "flag", "prompt_len": "number", "worker": "text"},
    "tokens": {"worker": "text"},
    "batches": {"oom": "flag", "peak_memory_bytes": "number", "useful_fraction": "number", "queue_len": "number"},
    "steps": {"worker": "text", "prefill_tokens": "number"},
}


class IndexPoint(BaseModel):
    """One point of sweep.json: where its run folder is (relative to the sweep) and how it ended."""

    model_config = ConfigDict(extra="allow")

    label: str
    rate: float | None = None  # null in a closed-loop sweep (its load is `concurrency`)
    concurrency: NonNegativeInt | None = None
    repeat: NonNegativeInt
    dir: str
    status: str
    reason: str | None = ""


class IndexEntry(BaseModel):
    """One strategy of the sweep's grid (its label orders the report's strategies)."""

    model_config = ConfigDict(extra="allow")

    label: str


class CapacityProbe(BaseModel):
    """One rate a capacity search measured, and whether it was sustained."""

    model_config = ConfigDict(extra="allow")

    rate_req_s: float
    sustained: bool


class CapacityEntry(BaseModel):
    """One strategy's capacity bracket (req/s and output tok/s; None: that side not measured)."""

    model_config = ConfigDict(extra="allow")

    lo_req_s: float | None = None
    hi_req_s: float | None = None
    estimate_req_s: float | None = None
    lo_tok_s: float | None = None
    hi_tok_s: float | None = None
    estimate_tok_s: float | None = None
    note: str | None = None
    probes: list[CapacityProbe] = []


class CapacityDoc(BaseModel):
    """capacity.json (or sweep.json's `capacity`): every strategy's bracket, by label."""

    model_config = ConfigDict(extra="allow")

    strategies: dict[str, CapacityEntry] = {}


class SweepIndex(BaseModel):
    """sweep.json as the report reads it; keys it does not read are kept as they are."""

    model_config = ConfigDict(extra="allow")

    points: list[IndexPoint] = []
    entries: list[IndexEntry] = []
    rates: list[float] | None = None
    concurrency: list[int] | int | None = None
    capacity: CapacityDoc | None = None
    probe: dict | None = None


def _read(path: Path, model: type[BaseModel], what: str) -> BaseModel:
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValidationError as exc:
        raise ValueError(f"{path}: not a batchlab {what} ({_first(exc)})") from None


def check_capacity(path: Path) -> None:
    """capacity.json checked against CapacityDoc; ValueError (one line) when it is not one."""
    _read(path, CapacityDoc, "capacity file")


def read_index(path: Path) -> dict:
    """sweep.json checked against SweepIndex, as a plain dict; ValueError (one line) when it is not one."""
    index = _read(path, SweepIndex, "sweep index")
    for i, point in enumerate(index.points):
        if point.rate is None and not point.concurrency:
            raise ValueError(f"{path}: not a batchlab sweep index (points.{i}: neither a rate nor a concurrency)")
    return index.model_dump(exclude_unset=True)


def _first(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'the file'}: {first['msg'].lower()}"


def _kind_ok(series: pd.Series, kind: Kind) -> bool:
    if kind == "flag":
        return pd.api.types.is_bool_dtype(series)
    if kind == "number":
        return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)
    return pd.api.types.is_string_dtype(series) or isinstance(series.dtype, pd.CategoricalDtype) or (
        series.dtype == object and series.dropna().map(lambda v: isinstance(v, str)).all())


def table_problem(name: str, df: pd.DataFrame) -> str | None:
    """What is wrong with a loaded table for the report, else None; a table with no columns is an absent
    one (a run that wrote none), which the report takes as empty."""
    if len(df.columns) == 0:
        return None
    missing = [c for c in REQUIRED[name] if c not in df.columns]
    if missing:
        return f"lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    wanted = REQUIRED[name] | {c: k for c, k in OPTIONAL[name].items() if c in df.columns}
    wrong = [f"{c} ({df[c].dtype}, not {k})" for c, k in wanted.items() if not _kind_ok(df[c], k)]
    return f"has columns of the wrong kind: {', '.join(wrong)}" if wrong else None


def inside(root: Path, folder: Path) -> bool:
    """Whether `folder` (links resolved) lies within `root`: the report pools no run from elsewhere."""
    return folder.resolve().is_relative_to(root.resolve())


CURVE_FREE = frozenset({"seed", "rate", "concurrency"})  # what may differ along one strategy's curve
LABEL_KEYS_SHOWN = 3  # distinguishing settings put into a split label
USABLE_STATUSES = ("done", "stopped")  # run.json statuses of a run that measured what it planned


class PoolingError(ValueError):
    """Runs that claim to be one point but are not."""


def curve_key(settings: dict) -> str:
    """The identity less seed and the load level (rate, or closed loop's clients), as one comparable
    text; open and closed loop stay apart (a curve has one kind of load axis)."""
    key = {k: v for k, v in identity(settings).items() if k not in CURVE_FREE}
    key["closed_loop"] = bool(settings.get("concurrency"))
    return json.dumps(key, sort_keys=True)


def unusable(folder) -> str | None:
    """Why a run folder's data is not a finished measurement (run.json's status), else None; a run
    written before run.json existed is taken as it is."""
    try:
        record = json.loads(RunDir(folder).run.read_text())
    except (OSError, ValueError):
        return None
    status = record.get("status") if isinstance(record, dict) else None
    if status in USABLE_STATUSES or status is None:
        return None
    if status == "running":
        return "incomplete: its run.json still says running (the launcher was killed, or it is still going)"
    return f"the run {status}" + (f": {record['reason']}" if record.get("reason") else "")


def _mixed(runs: list) -> dict[str, list[list]]:
    """label → its runs grouped by configuration (curve key), for the labels with more than one."""
    by_label: dict[str, dict[str, list]] = {}
    for run in runs:
        by_label.setdefault(run.label, {}).setdefault(curve_key(run.settings), []).append(run)
    return {label: list(by_key.values()) for label, by_key in by_label.items() if len(by_key) > 1}


def _distinguishing(groups: list[list]) -> list[str]:
    """The identity keys whose values differ between the groups (first run of each)."""
    keys: set[str] = set()
    first = groups[0][0].settings
    for other in groups[1:]:
        keys |= {d.split(" ", 1)[0] for d in differences(first, other[0].settings, ignore=CURVE_FREE)}
    return sorted(keys)


def split_mixed(runs: list) -> None:
    """Loose runs: a label whose runs differ (beyond seed and rate) becomes one label per configuration,
    e.g. 'dynamic (preset=a100-llama2-7b)' and 'dynamic (preset=3090-mistral-7b)'."""
    for label, groups in _mixed(runs).items():
        keys = _distinguishing(groups)[:LABEL_KEYS_SHOWN]
        for group in groups:
            ident = identity(group[0].settings)
            suffix = ", ".join(f"{k}={ident.get(k)}" for k in keys)
            for run in group:
                run.label = f"{label} ({suffix})"


def refuse_mixed(runs: list) -> None:
    """A sweep: every label's points must share one configuration but for seed and rate."""
    for label, groups in _mixed(runs).items():
        first, other = groups[0][0], groups[1][0]
        diffs = differences(first.settings, other.settings, ignore=CURVE_FREE)
        raise PoolingError(f"the points labelled {label} were measured with different configurations "
                           f"({first.folder} vs {other.folder}: {'; '.join(diffs) or 'open against closed loop'}); rerun the sweep (it "
                           "reruns points whose configuration changed) or report them separately")


class ReportError(BatchlabError, ValueError):
    """A folder the report refuses: `lines` says why, one line per bad file (the CLI prints each and
    exits 1)."""

    def __init__(self, *lines: str) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


class RunRefused(ValueError):
    """One run folder whose files the report cannot read (table_problem): one line."""


@dataclass(slots=True)
class RunData:
    """One run's tables and summary (times in s since its t0)."""

    label: str
    rate: float
    repeat: int
    folder: Path
    summary: Summary
    requests: pd.DataFrame
    tokens: pd.DataFrame
    batches: pd.DataFrame
    steps: pd.DataFrame

    @property
    def settings(self) -> dict:
        """The run's settings (RunConfig fields plus host facts and worker facts)."""
        return self.summary.settings


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
    tables = {name: _table(folder, name) for name in TABLE_NAMES}
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
    try:
        df = load_table(folder, name)
    except (OSError, ValueError) as exc:  # pyarrow's errors on a file that is not Parquet are ValueErrors
        raise RunRefused(f"{path}: cannot read it ({' '.join(str(exc).split()) or type(exc).__name__})") from None
    problem = table_problem(name, df)
    if problem:
        raise RunRefused(f"{path}: {problem}")
    return df


def _first_error(requests: pd.DataFrame) -> str:
    """The first failure reason in the table, preferring a cause over 'not sent' (its consequence)."""
    if "error" not in requests or "status" not in requests:
        return "requests.parquet holds no failure reason"
    errors = [str(e) for e in requests.loc[requests["status"] != "finished", "error"].dropna() if str(e)]
    causes = [e for e in errors if e != NOT_SENT]
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
        if point["status"] in ("done", "skipped") and RunDir(folder).summary.exists():
            run = _guarded(refused, load_run, folder, point["label"], point["repeat"], index_load(point))
            if run is not None:
                _add(coll, run, (point.get("reason") or "").partition("\n")[0])
        elif point["status"] != "pending":
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
