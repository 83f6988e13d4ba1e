"""One request on the collector side: what the RunStore holds while it is in memory (RequestState, its
tokens in TokenBuffers), what is left once it is gone (its id in EndedIds: a bit for the usual ids
0..n-1, so that a late event is recognised and counted instead of starting a new request), and the row
it becomes in requests.parquet (RequestOutcome, whose fields are that table's columns, names and dtypes).
"""
from array import array
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from operator import attrgetter
from typing import Protocol, get_type_hints

import numpy as np
import pandas as pd

from batchlab.collector.parts import SETTINGS_COLUMNS
from batchlab.protocol import Arrival, RequestMsg
from batchlab.protocol.ids import IdSet as EndedIds  # noqa: F401  (the ids of requests that left memory)
from batchlab.protocol.status import FailureReason, RequestStatus
from batchlab.stats.metrics import request_metrics

NAN = float("nan")
SCHEDULE_OFFSET_COLUMN = "arrival_offset_s"  # traffic.schedule's planned arrival, s since t0


@dataclass(slots=True)
class RequestState:
    """What is known about one request so far."""

    request_id: int
    arrival: Arrival | None = None
    batches: list[int] = field(default_factory=list)  # batch ids it was launched in, in order
    status: RequestStatus | None = None  # None until terminal
    error: str = ""
    terminal_batch: int | None = None  # the batch whose BatchDone made it terminal
    # once its token rows went to a part: the counting batch and its tokens' count, first and last
    # time (scheduler clock); the rows themselves are no longer in memory
    taken_batch: int | None = None
    taken: tuple[int, float, float] = (0, NAN, NAN)
    taken_at: int = 0  # the take (RunStore.take_parts call) that last wrote its request row


class HeldTokens(Protocol):
    """The token layout a RunStore holds for one attempt until its rows are taken: [(time, token_id), ...] in
    arrival order, over parallel `times` (scheduler-clock s) and `ids` (TokenBuffer; the simulator's views)."""

    @property
    def times(self) -> Sequence[float]: ...

    @property
    def ids(self) -> Sequence[int]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index): ...


class TokenBuffer(Sequence):
    """One attempt's tokens in arrival order, as [(time, token_id), ...] over two typed arrays (16 bytes
    a token, no Python object per token), held until the request's rows go to a part file."""

    __slots__ = ("times", "ids")

    def __init__(self) -> None:
        self.times = array("d")  # scheduler-clock s
        self.ids = array("q")

    def append(self, time: float, token_id: int) -> None:
        self.times.append(time)
        self.ids.append(token_id)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(zip(self.times[index], self.ids[index]))
        return self.times[index], self.ids[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Sequence)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # mutable


_BLANK = {int: 0, float: NAN, str: "", bool: False}  # a column's value when nothing is known, by its type


def request_fields(request_type: type = RequestMsg) -> list[tuple[str, type, object]]:
    """The columns a request message declares (every field but its id and those marked `column: False`), as
    make_dataclass fields: its counts, then its times, each in declaration order (requests.parquet's order)."""
    hints = get_type_hints(request_type)  # Annotated stripped: Length → int
    names = [f.name for f in fields(request_type) if f.name != "request_id" and f.metadata.get("column", True)]
    return [(n, hints[n], field(default=_BLANK[hints[n]])) for n in sorted(names, key=lambda n: n.endswith("_time"))]


def outcome_type(request_type: type = RequestMsg) -> type:
    """The record type of requests.parquet's rows: its id, status and error, the request's own columns
    (request_fields), then what the run made of it."""
    own = [  # name, type, default (what a row says when nothing is known: a request traffic never sent)
        ("recv_time", float, NAN),  # at the scheduler
        ("scheduled_time", float, NAN),  # its counting batch's launch
        ("first_token_time", float, NAN),
        ("completion_time", float, NAN),  # its last token, when finished
        # derived from the times above whenever records become a table (metrics.request_metrics, the
        # formulas the report uses too): NaN on a record
        ("queue_wait", float, NAN), ("ttft", float, NAN), ("tpot", float, NAN), ("e2e", float, NAN),
        ("n_tokens", int, 0),  # its counting attempt's
        ("batch_id", int, -1),  # its counting attempt (-1: never launched)
        ("worker", str, ""),
        ("attempts", int, 0),  # batches it was launched in
        ("submitted", bool, False),  # the scheduler received it
    ]
    head = [("request_id", int), ("status", RequestStatus), ("error", str)]  # error: why it failed ("" if not)
    record = make_dataclass("RequestOutcome", [*head, *request_fields(request_type),
                                               *[(n, t, field(default=d)) for n, t, d in own]],
                            slots=True, kw_only=True)
    record.__module__ = __name__
    record.__doc__ = ("What became of one request: its row of requests.parquet, its fields the table's columns in "
                      "order (times in s since the run's t0); then come the run's settings, then engine_* figures.")
    return record


# A request's row; its columns copied from its RequestMsg are REQUEST_COLUMNS (a `*_time` one shifted to t0).
RequestOutcome = outcome_type()
REQUEST_COLUMNS = tuple(name for name, _, _ in request_fields())
SCHEDULE_SOURCE = {"arrival_time": SCHEDULE_OFFSET_COLUMN}  # a request column → the schedule's, where it differs


# a field's type → its column's dtype
_DTYPE_OF = {int: "int64", float: "float64", str: "str", RequestStatus: "str", bool: "bool"}
DTYPES = {f.name: _DTYPE_OF[f.type] for f in fields(RequestOutcome)}  # the record's columns, in order
COLUMNS = [*DTYPES, *SETTINGS_COLUMNS]  # requests.parquet's columns before any engine_* ones
_values = attrgetter(*DTYPES)


def table(rows: list[RequestOutcome]) -> pd.DataFrame:
    """Records → a frame with the record's columns and dtypes (so every part has the same schema), its
    derived columns computed."""
    return request_metrics(pd.DataFrame([_values(r) for r in rows], columns=list(DTYPES)).astype(DTYPES))


def columns_table(n: int, **given: object) -> pd.DataFrame:
    """`n` rows from whole columns (an array or one value each); every column not given takes its
    field's default (a field without one must be given); its derived columns computed."""
    cols = {}
    for f in fields(RequestOutcome):
        if f.name not in given and f.default is MISSING:
            raise TypeError(f"columns_table: column {f.name} has no default")
        value = given.get(f.name, f.default)
        cols[f.name] = value if isinstance(value, np.ndarray) else np.full(n, value)
    return request_metrics(pd.DataFrame(cols).astype(DTYPES))


def unsent_table(schedule: pd.DataFrame, seen: object) -> pd.DataFrame:
    """The schedule's rows whose request id is not in `seen` (never sent), as failed request rows."""
    rows = schedule[~schedule["request_id"].isin(np.fromiter(seen, dtype=np.int64))]
    # the request's columns the schedule has (its offset from t0 is a table time), the others' defaults
    planned = {name: _column(rows, SCHEDULE_SOURCE.get(name, name), spec.default, kind)
               for name, kind, spec in request_fields()}
    return columns_table(len(rows), request_id=rows["request_id"].to_numpy(dtype=np.int64),
                         status=RequestStatus.FAILED, error=FailureReason.NOT_SENT, **planned)


def _column(df: pd.DataFrame, name: str, default: float, dtype: type) -> np.ndarray:
    return df[name].to_numpy(dtype=dtype) if name in df else np.full(len(df), default, dtype=dtype)


def with_settings(df: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """A requests frame with the run's settings columns added (in place)."""
    for name in SETTINGS_COLUMNS:
        df[name] = settings.get(name)
    return df
