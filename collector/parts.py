"""Crash-safe table files: small Parquet part files while running, merged final files at the end.

The tokens and steps tables are merged from their part files without holding them whole: steps are
copied part by part; tokens are sorted by request in slices of request ids (TOKEN_CHUNK_ROWS rows or
so at a time), which a part's request-id statistics say which files to read for.
"""
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchlab.collector.layout import SUMMARY_FILE
from batchlab.protocol.files import write_atomic, write_json_atomic

if TYPE_CHECKING:
    from batchlab.collector.tables import Tables

PARTS_DIR = ".parts"
TABLE_NAMES = ("requests", "tokens", "batches", "steps")
SCHEDULE_FILE = "schedule.parquet"
SCHEDULE_SKIPPED_COLUMNS = ("prompt", "prompt_tokens")  # bulky, and the collector needs neither
TOKEN_CHUNK_ROWS = 500_000  # token rows sorted in memory at once (5 columns × 8 bytes each)
TOKEN_ORDER = [("request_id", "ascending"), ("token_index", "ascending")]


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write then rename, so a reader never sees a half-written file."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    write_atomic(path, lambda tmp: pq.write_table(table, tmp))


class PartWriter:
    """Appends each batch of new rows as its own complete Parquet file under out_dir/.parts/."""

    def __init__(self, out_dir: Path) -> None:
        self.parts_dir = Path(out_dir) / PARTS_DIR
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self._seq = 0

    def write(self, parts: dict[str, pd.DataFrame]) -> None:
        """One part file per non-empty table."""
        for name, df in parts.items():
            _write_parquet(df, self.parts_dir / f"{name}-{self._seq:06d}.parquet")
        self._seq += 1


def _jsonable(value: object) -> object:
    """NaN → None and numpy scalars → Python, recursively (summary.json stays strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_final(out_dir: Path, tables: "Tables") -> None:
    """The final table files and summary.json; then the part files are removed (a table that is None
    was merged to its final file already, or has no rows)."""
    out_dir = Path(out_dir)
    for name in TABLE_NAMES:
        df = getattr(tables, name)
        if df is not None:
            _write_parquet(df, out_dir / f"{name}.parquet")
    write_summary(out_dir, tables.summary)
    shutil.rmtree(out_dir / PARTS_DIR, ignore_errors=True)


def write_summary(out_dir: Path, summary: dict) -> None:
    """out_dir/summary.json, strict JSON (NaN → null), written atomically."""
    write_json_atomic(Path(out_dir) / SUMMARY_FILE, _jsonable(summary), allow_nan=False)


def read_schedule(out_dir: Path) -> pd.DataFrame | None:
    """traffic's out_dir/schedule.parquet, or None when it is absent."""
    path = Path(out_dir) / SCHEDULE_FILE
    if not path.exists():
        return None
    names = pq.read_schema(path).names
    return pd.read_parquet(path, columns=[c for c in names if c not in SCHEDULE_SKIPPED_COLUMNS])


def load_table(out_dir: Path, name: str) -> pd.DataFrame:
    """A table from its final file, else from its part files (a killed run), else empty."""
    out_dir = Path(out_dir)
    final = out_dir / f"{name}.parquet"
    if final.exists():
        return pd.read_parquet(final)
    parts = sorted((out_dir / PARTS_DIR).glob(f"{name}-*.parquet"))
    if not parts:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def _parts(out_dir: Path, name: str) -> list[Path]:
    return sorted((Path(out_dir) / PARTS_DIR).glob(f"{name}-*.parquet"))


def merge_steps(out_dir: Path) -> None:
    """out_dir/steps.parquet from the steps part files, in order (none when no step arrived)."""
    paths = _parts(out_dir, "steps")
    if not paths:
        return
    schema = pq.read_schema(paths[0])

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for path in paths:
                writer.write_table(pq.read_table(path).replace_schema_metadata(schema.metadata))

    write_atomic(Path(out_dir) / "steps.parquet", write)


@dataclass(slots=True)
class _Source:
    """Token rows of one part file (or of memory) whose request ids lie in [lo, hi]."""

    lo: int
    hi: int
    rows: int
    read: Callable[[int, int], pa.Table]  # (lo, hi) -> its rows with lo <= request_id <= hi


def _between(table: pa.Table, lo: int, hi: int) -> pa.Table:
    ids = table["request_id"]
    return table.filter(pc.and_(pc.greater_equal(ids, lo), pc.less_equal(ids, hi)))


def _file_source(path: Path) -> _Source | None:
    meta = pq.read_metadata(path)
    if meta.num_rows == 0:
        return None
    col = meta.schema.to_arrow_schema().get_field_index("request_id")
    stats = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
    if all(st is not None and st.has_min_max for st in stats):
        lo, hi = min(st.min for st in stats), max(st.max for st in stats)
    else:  # a writer without statistics: read the column
        lo, hi = pc.min_max(pq.read_table(path, columns=["request_id"])["request_id"]).values()
        lo, hi = lo.as_py(), hi.as_py()
    return _Source(int(lo), int(hi), meta.num_rows, lambda a, b: _between(pq.ParquetFile(path).read(use_threads=False), a, b))


def _memory_source(table: pa.Table) -> _Source | None:
    if table.num_rows == 0:
        return None
    lo, hi = pc.min_max(table["request_id"]).values()
    return _Source(lo.as_py(), hi.as_py(), table.num_rows, lambda a, b: _between(table, a, b))


def _slices(sources: list[_Source]) -> list[tuple[int, int]]:
    """Request-id ranges [lo, hi] covering every source, each holding about TOKEN_CHUNK_ROWS rows."""
    out, lo, rows = [], min(s.lo for s in sources), 0
    for src in sorted(sources, key=lambda s: s.hi):
        rows += src.rows
        if rows >= TOKEN_CHUNK_ROWS and src.hi >= lo:
            out.append((lo, src.hi))
            lo, rows = src.hi + 1, 0
    top = max(s.hi for s in sources)
    if lo <= top:
        out.append((lo, top))
    return out


def merge_tokens(out_dir: Path, held: pd.DataFrame, finished_ids: list[int]) -> np.ndarray:
    """out_dir/tokens.parquet from the tokens part files and the `held` rows (requests never taken),
    sorted by request then token index; returns the finished requests' inter-token gaps (s) in that
    order, as metrics.inter_token_latencies would over the whole table."""
    held_table = pa.Table.from_pandas(held, preserve_index=False)
    schema = held_table.schema
    sources = [s for s in [*map(_file_source, _parts(out_dir, "tokens")), _memory_source(held_table)] if s]
    finished = np.asarray(finished_ids, dtype=np.int64)
    # fewer gaps than rows: filled in place (pages past the end are never touched, so never resident)
    gaps, n_gaps = np.empty(sum(s.rows for s in sources), dtype=np.float64), 0

    def write(tmp: Path) -> None:
        nonlocal n_gaps
        with pq.ParquetWriter(tmp, schema) as writer:
            for lo, hi in _slices(sources) if sources else []:
                parts = [s.read(lo, hi) for s in sources if s.lo <= hi and s.hi >= lo]
                chunk = pa.concat_tables([p.replace_schema_metadata(schema.metadata) for p in parts])
                chunk = chunk.sort_by(TOKEN_ORDER)
                writer.write_table(chunk)
                chunk_gaps = _sorted_gaps(chunk, finished)
                gaps[n_gaps:n_gaps + len(chunk_gaps)] = chunk_gaps
                n_gaps += len(chunk_gaps)
                del parts, chunk, chunk_gaps

    write_atomic(Path(out_dir) / "tokens.parquet", write)
    return gaps[:n_gaps]


def _sorted_gaps(chunk: pa.Table, finished: np.ndarray) -> np.ndarray:
    """metrics.inter_token_latencies over rows already sorted by request and token index, on columns."""
    rids = chunk["request_id"].to_numpy()
    keep = np.isin(rids, finished)
    rids, times = rids[keep], chunk["time"].to_numpy()[keep]
    return (times[1:] - times[:-1])[rids[1:] == rids[:-1]]
