"""Crash-safe table files: small Parquet part files while running, final files at the end (merged
from the parts by collector.merge). A request's or a batch's row may be written again in a later part
(its row changed); a reader keeps the last one.
"""
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.collector.layout import SUMMARY_FILE
from batchlab.collector.run_columns import RUN_COLUMNS, SETTINGS_COLUMNS, run_values, stamped
from batchlab.protocol.files import write_atomic, write_json_atomic

if TYPE_CHECKING:
    from batchlab.collector.tables import Tables

PARTS_DIR = ".parts"
TABLE_NAMES = ("requests", "tokens", "batches", "steps")
SCHEDULE_FILE = "schedule.parquet"
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
        self.parts_dir = Path(out_dir) / PARTS_DIR
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self._seq = 0

    def write(self, parts: dict[str, pd.DataFrame]) -> None:
        """One part file per non-empty table."""
        for name, df in parts.items():
            write_parquet(df, self.parts_dir / f"{name}-{self._seq:06d}.parquet")
        self._seq += 1


def _jsonable(value: object) -> object:
    """NaN → None, numpy scalars → Python, bytes → hex, anything else JSON lacks → its text, recursively
    (summary.json stays strict JSON whatever a peer's settings or stats held)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def write_final(out_dir: Path, tables: "Tables") -> None:
    """The final table files and summary.json; then the part files are removed (a table that is None
    was merged to its final file already, or has no rows); each with the run's identity columns."""
    out_dir = Path(out_dir)
    run = run_values(tables.summary.get("settings") or {})
    for name in TABLE_NAMES:
        df = getattr(tables, name)
        if df is not None:
            write_parquet(df, out_dir / f"{name}.parquet", run)
    write_summary(out_dir, tables.summary)
    shutil.rmtree(out_dir / PARTS_DIR, ignore_errors=True)


def write_summary(out_dir: Path, summary: dict) -> None:
    """out_dir/summary.json, strict JSON (NaN → null; the setting rate inf, all at once, → "inf" as vLLM
    writes it), written atomically."""
    settings = summary.get("settings")
    if isinstance(settings, dict) and isinstance(settings.get("rate"), float) and math.isinf(settings["rate"]):
        summary = {**summary, "settings": {**settings, "rate": "inf"}}
    write_json_atomic(Path(out_dir) / SUMMARY_FILE, _jsonable(summary), allow_nan=False)


def read_schedule(out_dir: Path) -> pd.DataFrame | None:
    """traffic's out_dir/schedule.parquet, or None when it is absent."""
    path = Path(out_dir) / SCHEDULE_FILE
    if not path.exists():
        return None
    names = pq.read_schema(path).names
    return pd.read_parquet(path, columns=[c for c in names if c not in SCHEDULE_SKIPPED_COLUMNS])


def load_table(out_dir: Path, name: str) -> pd.DataFrame:
    """A table from its final file, else from its part files (a killed run), else empty. Only requests
    keeps the run's identity columns (the others' rows are many, and the summary has the settings)."""
    out_dir = Path(out_dir)
    final = out_dir / f"{name}.parquet"
    if final.exists():
        names = pq.read_schema(final).names
        return pd.read_parquet(final, columns=None if name == "requests" else
                               [c for c in names if c not in (*SETTINGS_COLUMNS, *RUN_COLUMNS)])
    parts = part_files(out_dir, name)
    if not parts:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    if name in ROW_KEYS:  # a row written again replaces the earlier one
        df = df.drop_duplicates(ROW_KEYS[name], keep="last", ignore_index=True)
    return df


def part_files(out_dir: Path, name: str) -> list[Path]:
    """A table's part files, in the order they were written."""
    return sorted((Path(out_dir) / PARTS_DIR).glob(f"{name}-*.parquet"))
