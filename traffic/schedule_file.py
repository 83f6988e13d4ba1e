"""A saved schedule file's footer and planned columns, read with pyarrow alone: what the scheduler checks each
request against (saved_plan) without importing pandas (traffic.schedule's), which a role's process would otherwise
pay for at every run's start (with it the scheduler's process imported 0.60 s of CPU, without 0.44 s, on the 2-core
AMD EPYC VM)."""
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.protocol.errors import DatasetError

META_HASH, META_CONFIG, META_DURATION = b"batchlab.schedule_hash", b"batchlab.config", b"batchlab.duration_s"


def saved_footer(path: str | Path) -> tuple[str, float | None]:
    """(stored hash, planned duration or None) of a saved schedule, from its footer; DatasetError when it has none."""
    path = Path(path)
    meta = read_file(path, pq.read_metadata).metadata or {}
    if META_HASH not in meta:
        raise DatasetError(f"{path} is not a batchlab schedule (missing its hash)")
    return meta[META_HASH].decode(), float(meta[META_DURATION]) if META_DURATION in meta else None


def read_file(path: Path, read: Callable[[Path], object]) -> object:
    """read(path) of a schedule file, or DatasetError when it is missing or unreadable."""
    if not path.is_file():
        raise DatasetError(f"schedule file not found: {path}")
    try:
        return read(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DatasetError(f"cannot read schedule {path}: {exc}") from None


def saved_plan(path: str | Path) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(stored hash, planned offsets, prompt lengths, output lengths by request id) of a saved schedule, without
    its prompts: what the scheduler checks each request against; DatasetError when unreadable."""
    path = Path(path)
    table, meta = _read_table_columns(path, ["request_id", "arrival_offset_s", "prompt_len", "output_len"])
    ids = table.column("request_id").to_numpy()
    if not np.array_equal(ids, np.arange(len(ids))):
        raise DatasetError(f"{path} is not a batchlab schedule (its request ids are not 0 .. n - 1)")
    return (meta[META_HASH].decode(), *(table.column(c).to_numpy() for c in ("arrival_offset_s", "prompt_len",
                                                                               "output_len")))


def _read_table_columns(path: Path, columns: list[str]) -> tuple[pa.Table, dict[bytes, bytes]]:
    """Some columns of a schedule file and its metadata, or DatasetError."""
    table = read_file(path, lambda p: pq.read_table(p, columns=columns))
    meta = table.schema.metadata or {}
    if META_HASH not in meta:
        raise DatasetError(f"{path} is not a batchlab schedule (missing its hash)")
    return table, meta
