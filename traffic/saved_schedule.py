"""A saved schedule read for sending, a batch of rows at a time: the traffic of `batchlab run` replays the
schedule the launcher saved without holding it. Held whole (traffic.schedule.load_schedule: each prompt's
text and tokens as objects), a 60 s soak at 5,000 req/s of ShareGPT prompts kept 1.7 GiB in the traffic
process from its start; read here, the traffic's memory is a batch of rows whatever the run's length.

Its integrity is checked as load_schedule checks it (the content hash recomputed over the file, one column
at a time, a batch of rows at a time; request ids 0 .. n - 1; each prompt_len the length of its tokens)."""
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.traffic.datasets import DatasetError
from batchlab.traffic.schedule import digest
from batchlab.traffic.schedule_file import saved_footer

BATCH_ROWS = 4096  # schedule rows read at once (their prompts packed: a few MiB)


@dataclass(slots=True)
class SavedSchedule:
    """What the traffic needs of a saved schedule: its size, hash and duration up front, then its requests
    in order (request_id, arrival offset s, prompt_len, output_len, packed prompt tokens) as the file is read."""

    path: Path
    n_requests: int
    content_hash: str
    duration_s: float

    def requests(self) -> Iterator[tuple[int, float, int, int, bytes]]:
        """Every request in order, its prompt packed as the wire carries it (little-endian uint32)."""
        columns = ["request_id", "arrival_offset_s", "prompt_len", "output_len", "prompt_tokens"]
        for batch in _batches(self.path, columns):
            tokens = batch.column(4)
            flat = np.asarray(tokens.flatten().to_numpy(zero_copy_only=False), dtype="<u4").tobytes()
            ends = np.cumsum(tokens.value_lengths().to_numpy(zero_copy_only=False)) * 4
            starts = np.concatenate(([0], ends[:-1]))
            packed = [flat[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
            yield from zip(*(batch.column(i).to_pylist() for i in range(4)), packed)


def open_saved_schedule(path: str | Path) -> SavedSchedule:
    """A saved schedule checked as load_schedule checks it, its rows left in the file; DatasetError when it
    is missing, unreadable, or fails its integrity check."""
    path = Path(path)
    stored, duration_s = saved_footer(path)
    n = pq.read_metadata(path).num_rows
    tokens = (b.column(0).flatten().to_numpy(zero_copy_only=False) for b in _batches(path, ["prompt_tokens"]))
    actual = digest(n, _column(path, "arrival_offset_s"), _column(path, "prompt_len"), _column(path, "output_len"),
                    tokens)
    if actual != stored or not _consistent(path, n):
        raise DatasetError(f"schedule {path} fails its integrity check (stored hash {stored[:12]}..., content hash "
                           f"{actual[:12]}...); it was modified or damaged")
    if duration_s is None:  # a file saved without one: its latest planned arrival
        duration_s = max((float(np.max(o, initial=0.0)) for o in _column(path, "arrival_offset_s")), default=0.0)
    return SavedSchedule(path, n, actual, duration_s)


def _column(path: Path, name: str) -> Iterator[np.ndarray]:
    """One column of the file, a batch of rows at a time."""
    return (b.column(0).to_numpy(zero_copy_only=False) for b in _batches(path, [name]))


def _consistent(path: Path, n: int) -> bool:
    """request_id is 0..n-1 and prompt_len is each prompt's token count (neither is covered by the hash)."""
    start = 0
    for batch in _batches(path, ["request_id", "prompt_len", "prompt_tokens"]):
        ids = batch.column(0).to_numpy(zero_copy_only=False)
        lens = batch.column(2).value_lengths().to_numpy(zero_copy_only=False)
        if not (np.array_equal(ids, np.arange(start, start + len(ids)))
                and np.array_equal(batch.column(1).to_numpy(zero_copy_only=False), lens)):
            return False
        start += len(ids)
    return start == n


def _batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The file's rows BATCH_ROWS at a time, these columns only; DatasetError when it cannot be read."""
    try:
        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise DatasetError(f"cannot read schedule {path}: {exc}") from None
