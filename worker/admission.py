"""What a worker refuses of a Dispatch before running any of it: rows beyond the maximum its hello
announced, a batch id it runs already, a request id it runs already (or twice in one dispatch).

A refused batch still ends in one BatchDone whose rows fail with the reason, so each request gets its
one terminal record; a row whose id another running request holds is left out (that request keeps its
own end), and a batch whose id is running is not answered at all (its answer would end the live one).
"""
from collections.abc import Container
from dataclasses import dataclass, field

from batchlab.protocol.clock import now
from batchlab.protocol.messages import BatchDone, Dispatch, FailedRow, RequestRow
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.status import FailureKind, detailed
from batchlab.worker.backend import BackendInfo

@dataclass
class OpenBatch:
    """A dispatched batch still running in continuous mode: the rows it waits for, how the others ended."""

    left: set[int]
    start_time: float
    finished: list[int] = field(default_factory=list)
    failed: list[FailedRow] = field(default_factory=list)


@dataclass(slots=True)
class Admission:
    """A Dispatch sorted: batches to run, BatchDones that refuse the others, and why each was refused
    (the worker counts each in its rejected_messages)."""

    accepted: list[tuple[int, list[RequestRow]]] = field(default_factory=list)
    answers: list[BatchDone] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def admit(msg: Dispatch, worker_id: str, info: BackendInfo, open_batches: Container[int],
          live_ids: dict[int, int]) -> Admission:
    """Sort `msg`'s batches (its rows grouped by batch id): a static worker runs each batch alone, so each may hold the announced
    max_batch_size rows; a continuous one holds that many in all, those running (`live_ids`) included."""
    out, seen, t = Admission(), set(), now()
    max_rows, continuous = info.max_batch_size, info.mode == BatchingMode.CONTINUOUS
    room = max_rows - len(live_ids) if continuous else max_rows
    for batch_id, rows in by_batch(msg.requests).items():
        reason = _refusal(batch_id, rows, room, max_rows, open_batches, live_ids, seen)
        if reason is None:
            out.accepted.append((batch_id, rows))
            room -= len(rows) if continuous else 0
            seen.update(r.request.request_id for r in rows)
            continue
        out.refused.append(f"batch {batch_id} of {len(rows)} rows {reason}")
        if batch_id not in open_batches:
            failed = _fresh(rows, live_ids, seen)
            seen.update(failed)  # ended here: a later batch of this dispatch may not run them
            out.answers.append(BatchDone(batch_id, worker_id, t, t, [], [FailedRow(rid, reason) for rid in failed]))
    return out


def by_batch(rows: list[RequestRow]) -> dict[int, list[RequestRow]]:
    """{batch_id: its rows}, in the order of each batch's first row."""
    out: dict[int, list[RequestRow]] = {}
    for row in rows:
        out.setdefault(row.batch_id, []).append(row)
    return out


def _refusal(batch_id: int, rows: list[RequestRow], room: int, max_rows: int, open_batches: Container[int],
             live_ids: Container[int], seen: set[int]) -> str | None:
    """Why this batch is refused (short: a refusal of 2**20 rows must fit one frame), or None."""
    if batch_id in open_batches:
        return detailed(FailureKind.REFUSED, f"batch {batch_id} runs already")
    ids = [r.request.request_id for r in rows]
    clash = next((rid for rid in ids if rid in live_ids or rid in seen), None)
    if clash is not None or len(set(ids)) != len(ids):
        taken = clash if clash is not None else _repeated(ids)
        return detailed(FailureKind.REFUSED, f"request id {taken} is taken")
    if len(rows) > room:
        return detailed(FailureKind.REFUSED, f"{len(rows)} rows > {max_rows} announced")
    return None


def _fresh(rows: list[RequestRow], live_ids: Container[int], seen: set[int]) -> list[int]:
    """The distinct ids of `rows` that no running or accepted request holds, in order."""
    ids = (r.request.request_id for r in rows)
    return list(dict.fromkeys(rid for rid in ids if rid not in live_ids and rid not in seen))


def _repeated(ids: list[int]) -> int:
    """The first id that comes twice."""
    met = set()
    for rid in ids:
        if rid in met:
            return rid
        met.add(rid)
    raise ValueError("no id repeats")
