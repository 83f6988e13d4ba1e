"""Crash-safe table files: small Parquet part files while running, final files at the end (merged
from the parts by collector.merge). A request's or a batch's row may be written again in a later part
(its row changed); a reader keeps the last one.

A run's identity as constant columns of every table it writes, so that a sweep's tables, read as
one, still say which run each row came from: its label, strategy and parameters, backend, model, rate,
seed, repeat and config hash (protocol.identity). The collector adds them at its final write; text
columns are dictionary-encoded (one value, and an index of zeros that Parquet stores run-length encoded).
"""
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.collector.summary import Summary, write_summary
from batchlab.protocol.files import write_atomic
from batchlab.protocol.identity import config_hash, identity
from batchlab.protocol.run_dir import TABLE_NAMES, RunDir
from batchlab.protocol.settings import vllm_rule

SCHEDULE_SKIPPED_COLUMNS = ("prompt", "prompt_tokens")  # bulky, and the collector needs neither
ROW_KEYS = {"requests": "request_id", "batches": "batch_id"}  # tables whose rows may be rewritten
# requests.parquet had these before the others (as plain columns); every table carries all of them
SETTINGS_COLUMNS = ("strategy", "backend", "model", "rate", "concurrency", "arrival", "seed")
RUN_COLUMNS = ("label", "strategy_args", "repeat", "config_hash")
TYPES = {"rate": pa.float64(), "concurrency": pa.int64(), "seed": pa.int64(), "repeat": pa.int64()}  # the others: text
TEXT = pa.dictionary(pa.int32(), pa.string())


@dataclass(slots=True)
class Tables:
    """The run's final tables (times in s since t0) and its summary, as write_final writes them (built by
    collector.tables, or merged by collector.merge)."""

    # None: merged to its file from the part files already (the collector), or no rows (steps)
    requests: pd.DataFrame | None
    tokens: pd.DataFrame | None
    batches: pd.DataFrame | None
    steps: pd.DataFrame | None
    summary: Summary


def run_label(settings: dict) -> str:
    """The run's label: the sweep's for its strategy entry, else vllm or the strategy's name."""
    given = settings.get("label")
    if given:
        return str(given)
    return vllm_rule(str(settings.get("strategy", "run")), str(settings.get("backend", "")))[2]


def run_values(settings: dict) -> dict[str, object]:
    """Every identity column's value for a run of these settings (RunInfo's, or a summary's)."""
    args = identity(settings).get("strategy_args") or {}
    values = {name: settings.get(name) for name in SETTINGS_COLUMNS}
    text = json.dumps(args, sort_keys=True, separators=(",", ":"))
    return values | {"label": run_label(settings), "strategy_args": text, "repeat": settings.get("repeat", 0),
                     "config_hash": config_hash(settings)}


def _constant(value: object, rows: int, kind: pa.DataType) -> pa.Array:
    """`rows` copies of `value` (a number setting that is no number, as a peer may send: as text)."""
    if value is None:
        return pa.nulls(rows, type=kind)
    if kind != TEXT and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return pa.array(np.full(rows, value), type=kind)
        except (OverflowError, ValueError, pa.ArrowException):  # beyond int64, or a fraction of a seed
            pass
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([str(value)]))


def stamped(table: pa.Table, values: dict[str, object]) -> pa.Table:
    """`table` with every identity column it lacks appended (a column it has is left as it is)."""
    for name, value in values.items():
        if name not in table.schema.names:
            table = table.append_column(name, _constant(value, table.num_rows, TYPES.get(name, TEXT)))
    return table


def write_parquet(df: pd.DataFrame, path: Path, run: dict | None = None) -> None:
    """Write then rename, so a reader never sees a half-written file; `run`: the identity columns to add
    (a final table: run_values)."""
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


def write_final(out_dir: Path, tables: Tables) -> None:
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


def load_table(out_dir: Path, name: str, columns: list[str] | None = None,
               categories: tuple[str, ...] = ()) -> pd.DataFrame:
    """A table from its final file, else from its part files (a killed run), else empty. Only requests
    keeps the run's identity columns (the others' rows are many, and the summary has the settings);
    `columns`: only these of the final file's (a reader of a table with millions of rows: the tokens, the
    steps); `categories`: these text columns of the final file read as categoricals (a worker's name on each of
    millions of rows)."""
    final = RunDir(out_dir).table(name)
    if final.exists():
        names = pq.read_schema(final).names
        if columns is not None:
            return pd.read_parquet(final, columns=[c for c in columns if c in names],
                                   read_dictionary=[c for c in categories if c in names and c in columns] or None)
        return pd.read_parquet(final, columns=None if name == "requests" else
                               [c for c in names if c not in (*SETTINGS_COLUMNS, *RUN_COLUMNS)])
    return parts_table(out_dir, name)


def parts_table(out_dir: Path, name: str) -> pd.DataFrame:
    """A table from its part files (a run killed before its final write), every column; empty when none."""
    parts = RunDir(out_dir).parts(name)
    if not parts:
        return pd.DataFrame()
    df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    if name in ROW_KEYS:  # a row written again replaces the earlier one
        df = df.drop_duplicates(ROW_KEYS[name], keep="last", ignore_index=True)
    return df
