"""What the report accepts from a folder it is given: sweep.json's index as a typed model, each table's
required columns and their kinds, and run folders only inside the folder. A file that fails is named
with what is wrong in one line (never a traceback); points.load_collection gathers those lines.

Kinds are loose on purpose: a "number" column may hold ints or floats (NaN is a missing value), a
"text" column strings, a "flag" column booleans; whatever else a table holds is not read.
"""
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, NonNegativeInt, ValidationError, model_validator

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
NON_NEGATIVE: dict[str, tuple[str, ...]] = {  # counts: a value below 0 is no count (NaN: missing)
    "requests": ("n_tokens", "output_len", "prompt_len"), "tokens": ("token_index",), "batches": ("size",),
    "steps": ("running", "prefill_tokens"),
}


class Loose(BaseModel):
    """A file's object as the report reads it: keys it does not read are kept as they are."""

    model_config = ConfigDict(extra="allow")


class IndexPoint(Loose):
    """One point of sweep.json: where its run folder is (relative to the sweep) and how it ended."""

    label: str
    rate: float | None = None  # null in a closed-loop sweep (its load is `concurrency`)
    concurrency: NonNegativeInt | None = None
    repeat: NonNegativeInt
    dir: str
    status: str
    reason: str | None = ""


class IndexEntry(Loose):
    """One strategy of the sweep's grid (its label orders the report's strategies)."""

    label: str


class Strict(Loose):
    """A number is a JSON number (a "4.5" string is refused here, not where a figure is computed from it)."""

    model_config = ConfigDict(extra="allow", strict=True)


class ProbeEntry(Strict):
    """One rate a capacity search measured, and whether it was sustained."""

    rate_req_s: float
    sustained: bool


class SaturatedRunEntry(Strict):
    """One repeat's saturated run: its completion rate (req/s)."""

    repeat: NonNegativeInt
    req_s: float | None = None


class Saturated(Strict):
    """A strategy's saturated rate μ (req/s) with its 95% interval, and the runs behind it."""

    req_s: float
    req_s_lo: float
    req_s_hi: float
    runs: list[SaturatedRunEntry] = []


class CapacityEntry(Strict):
    """One strategy's capacity bracket (req/s and output tok/s; None: that side not measured), and its μ."""

    lo_req_s: float | None = None
    hi_req_s: float | None = None
    estimate_req_s: float | None = None
    lo_tok_s: float | None = None
    hi_tok_s: float | None = None
    estimate_tok_s: float | None = None
    note: str | None = None
    probes: list[ProbeEntry] = []
    saturated: Saturated | None = None

    @model_validator(mode="after")
    def _estimate_of_a_closed_bracket(self) -> "CapacityEntry":
        """A closed bracket has its estimate (its geometric mean): the report compares estimates."""
        if self.lo_req_s and self.hi_req_s and self.estimate_req_s is None:
            raise ValueError("lo_req_s and hi_req_s are given but estimate_req_s is not")
        return self


class CapacityDoc(Strict):
    """capacity.json (or sweep.json's `capacity`): every strategy's bracket, by label."""

    strategies: dict[str, CapacityEntry] = {}


class SweepIndex(Loose):
    """sweep.json as the report reads it."""

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
    if wrong:
        return f"has columns of the wrong kind: {', '.join(wrong)}"
    negative = [c for c in NON_NEGATIVE[name] if c in df.columns and (df[c] < 0).any()]
    return f"has negative counts in {', '.join(negative)}" if negative else None


def inside(root: Path, folder: Path) -> bool:
    """Whether `folder` (links resolved) lies within `root`: the report pools no run from elsewhere."""
    return folder.resolve().is_relative_to(root.resolve())
