"""Crash-safe table files: small Parquet part files while running, final files at the end (merged
from the parts by collector.merge). A request's or a batch's row may be written again in a later part
(its row changed); a reader keeps the last one.
"""
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.collector.run_columns import RUN_COLUMNS, SETTINGS_COLUMNS, run_values, stamped
from batchlab.collector.summary import write_summary
from batchlab.protocol.files import write_atomic, write_json_atomic
from batchlab.protocol.run_dir import TABLE_NAMES, RunDir

if TYPE_CHECKING:
    from batchlab.collector.tables import Tables

SCHEDULE_SKIPPED_COLUMNS = ("prompt", "prompt_tokens")  # bulky, and the collector needs neither
ROW_KEYS = {"requests": "request_id", "batches": "batch_id"}  # tables whose rows may be rewritten


def write_parquet(df: pd.DataFrame, path: Path, run: dict | None = None) -> None:
    """Write then rename, so a reader never sees a half-written file; `run`: the identity columns to add
    (a final table: run_columns.run_values)."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = stamped(table, run) if run is not None else table
    write_atomic(path, lambda tmp: pq.write_table(table, tmp))


class PartWriter:
    """Appends each batch of new rows as its own complete Parquet file under out_dir/.parts/."""

    def __init__(self, out_dir: Path) -> None:
        self.run_dir = RunDir(out_dir)
        self.parts_dir = self.run_dir.parts_dir
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self._seq = 0

    def write(self, parts: dict[str, pd.DataFrame]) -> None:
        """One part file per non-empty table."""
        for name, df in parts.items():
            write_parquet(df, self.run_dir.part(name, self._seq))
        self._seq += 1


def write_final(out_dir: Path, tables: "Tables") -> None:
    """The final table files and summary.json; then the part files are removed (a table that is None
    was merged to its final file already, or has no rows); each with the run's identity columns."""
    folder = RunDir(out_dir)
    run = run_values(tables.summary.settings)
    for name in TABLE_NAMES:
        df = getattr(tables, name)
        if df is not None:
            write_parquet(df, folder.table(name), run)
    write_summary(out_dir, tables.summary)
    shutil.rmtree(folder.parts_dir, ignore_errors=True)


def read_schedule(out_dir: Path) -> pd.DataFrame | None:
    """traffic's out_dir/schedule.parquet, or None when it is absent."""
    path = RunDir(out_dir).schedule
    if not path.exists():
        return None
    names = pq.read_schema(path).names
    return pd.read_parquet(path, columns=[c for c in names if c not in SCHEDULE_SKIPPED_COLUMNS])


def load_table(out_dir: Path, name: str) -> pd.DataFrame:
    """A table from its final file, else from its part files (a killed run), else empty. Only requests
    keeps the run's identity columns (the others' rows are many, and the summary has the settings)."""
    final = RunDir(out_dir).table(name)
    if final.exists():
        names = pq.read_schema(final).names
        return pd.read_parquet(final, columns=None if name == "requests" else
                               [c for c in names if c not in (*SETTINGS_COLUMNS, *RUN_COLUMNS)])
    parts = RunDir(out_dir).parts(name)
    if not parts:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    if name in ROW_KEYS:  # a row written again replaces the earlier one
        df = df.drop_duplicates(ROW_KEYS[name], keep="last", ignore_index=True)
    return df
