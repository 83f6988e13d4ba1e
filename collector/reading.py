"""The runs under a folder read for analysis: one run's folder, a sweep's (the points its sweep.json lists as
measured) or any folder holding run folders; a table over all of them is one pandas frame (or one DuckDB view),
each row with its run's identity columns (label, strategy, rate, repeat, config_hash, ...: collector.parts).

Tables written before the identity columns existed get them here from the run's summary; rows of a run that
was killed before its final write come from its part files (the last version of a rewritten row). A sweep's
probe, burst and saturated runs (its `_` folders) are no points of it and are left out.
"""
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from batchlab.protocol.outcomes import MEASURED  # noqa: F401  (its readers')
from batchlab.collector.layout import INDEX_FILE
from batchlab.collector.parts import RUN_COLUMNS, SETTINGS_COLUMNS, parts_table, run_values
from batchlab.collector.summary import read_summary
from batchlab.protocol.errors import ReportError
from batchlab.protocol.run_dir import SUMMARY_FILE, TABLE_NAMES, RunDir

IDENTITY_COLUMNS = (*SETTINGS_COLUMNS, *RUN_COLUMNS)
TEXT_IDENTITY = ("label", "strategy", "strategy_args", "backend", "model", "arrival", "config_hash")


def run_folders(root: str | Path) -> list[Path]:
    """The run folders at or under `root`: itself when it is one; a sweep's measured points in its index's
    order; else every folder below holding a summary.json, outside `_` folders (probes, saturated runs)."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    if RunDir(root).summary.is_file() and not (root / INDEX_FILE).is_file():
        return [root]
    if (root / INDEX_FILE).is_file():
        try:
            points = json.loads((root / INDEX_FILE).read_text())["points"]
            return [root / p["dir"] for p in points if p.get("status") in MEASURED]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"{root / INDEX_FILE}: not a batchlab sweep index ({type(exc).__name__}: "
                              f"{exc})") from None
    found = sorted(p.parent for p in root.rglob(SUMMARY_FILE))
    return [f for f in found if not any(part.startswith("_") for part in f.relative_to(root).parts)]


def read_table(folders: list[Path], name: str, columns: list[str] | None = None) -> pd.DataFrame:
    """Table `name` (requests, tokens, batches, steps) of every folder as one frame, each row with its run's
    identity columns (text ones as categories); `columns`: only these (the identity columns come anyway)."""
    if name not in TABLE_NAMES:
        raise ValueError(f"no table {name!r} (one of {', '.join(TABLE_NAMES)})")
    frames = [f for f in (_run_table(Path(folder), name, columns) for folder in folders) if len(f)]
    if not frames:
        return pd.DataFrame(columns=list(columns or []) + list(IDENTITY_COLUMNS))
    df = pd.concat(frames, ignore_index=True)
    for column in TEXT_IDENTITY:  # concatenated categories of different runs become text: categories again
        if column in df:
            df[column] = df[column].astype("category")
    return df


def _run_table(folder: Path, name: str, columns: list[str] | None) -> pd.DataFrame:
    """One run's table with every identity column (from its summary where the file lacks one)."""
    final, wanted = RunDir(folder).table(name), None
    if columns is not None:
        wanted = list(dict.fromkeys([*columns, *IDENTITY_COLUMNS]))
    if final.is_file():
        present = set(pq.read_schema(final).names)
        df = pd.read_parquet(final, columns=None if wanted is None else [c for c in wanted if c in present])
    else:
        df = parts_table(folder, name)
        if df.columns.empty:  # no part files
            return df
        df = df if wanted is None else df[[c for c in wanted if c in df]]
    missing = [c for c in IDENTITY_COLUMNS if c not in df]
    if missing:
        values = run_values(read_summary(folder).settings)
        for column in missing:
            df[column] = values[column]
    return df


def connect(folders: list[Path]):
    """A DuckDB connection with one view per table (requests, tokens, batches, steps) over the folders' final
    files, read by column name (a run lacking a column gives NULL there); None of a table that no run has."""
    try:
        import duckdb
    except ImportError:
        raise ReportError("reading runs with SQL needs DuckDB: pip install duckdb") from None
    con = duckdb.connect()
    for name in TABLE_NAMES:
        files = [str(RunDir(f).table(name)) for f in folders if RunDir(f).table(name).is_file()]
        if files:
            listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)  # SQL string literals
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{listed}], union_by_name = true, "
                        "hive_partitioning = false)")
    return con
