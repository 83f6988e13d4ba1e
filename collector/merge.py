"""The run's final files, merged from the part files in bounded memory, and the summary from them.

requests, tokens and batches are merged in slices of their key (request id, batch id), about
*_CHUNK_ROWS rows at a time; a part's key statistics say which files a slice reads. A request's or
batch's row written again in a later part replaces the earlier one. Steps are copied part by part.
The summary reads requests.parquet back in slices (percentiles of the per-request latencies from
their float64 columns, 8 bytes a request each) and the inter-token gaps from a scratch file of
float64 values, written while the tokens are merged (quantiles: exact, in bounded memory).
"""
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchlab.collector import request, tables
from batchlab.collector.parts import read_schedule, run_values, stamped, write_parquet
from batchlab.collector.store_view import StoreView
from batchlab.collector.summary import Summary
from batchlab.collector.tables import Tables
from batchlab.protocol.files import write_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.status import RequestStatus
from batchlab.stats.metrics import LATENCY_STATS, RequestFigures
from batchlab.stats.quantiles import chunked_percentiles

TOKEN_CHUNK_ROWS = 200_000  # token rows sorted in memory at once (5 columns × 8 bytes each)
REQUEST_CHUNK_ROWS = 50_000  # request rows (about 30 columns) merged at once
STEP_CHUNK_ROWS = 100_000  # step rows (8 columns) gathered from their parts into one row group
SPILL_CHUNK_VALUES = 1 << 18  # inter-token gaps read back at once (2 MiB; 8 MiB as a list for the sum)
TOKEN_ORDER = [("request_id", "ascending"), ("token_index", "ascending")]
SUMMARY_COLUMNS = ["status", "error", "submitted", "prompt_len", "output_len", "arrival_time",
                   "scheduled_time", "first_token_time", "completion_time", "n_tokens"]


@dataclass(slots=True)
class _Source:
    """Rows of one part file (or of memory) whose key lies in [lo, hi]."""

    lo: int
    hi: int
    rows: int
    read: Callable[[int, int], pa.Table]  # (lo, hi) -> its rows with lo <= key <= hi


def _between(table: pa.Table, key: str, lo: int, hi: int) -> pa.Table:
    ids = table[key]
    return table.filter(pc.and_(pc.greater_equal(ids, lo), pc.less_equal(ids, hi)))


def _file_source(path: Path, key: str) -> _Source | None:
    meta = pq.read_metadata(path)
    if meta.num_rows == 0:
        return None
    col = meta.schema.to_arrow_schema().get_field_index(key)
    stats = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
    if all(st is not None and st.has_min_max for st in stats):
        lo, hi = min(st.min for st in stats), max(st.max for st in stats)
    else:  # a writer without statistics: read the column
        lo, hi = pc.min_max(pq.read_table(path, columns=[key])[key]).values()
        lo, hi = lo.as_py(), hi.as_py()
    return _Source(int(lo), int(hi), meta.num_rows,
                   lambda a, b: _between(pq.ParquetFile(path).read(use_threads=False), key, a, b))


def _memory_source(table: pa.Table, key: str) -> _Source | None:
    if table.num_rows == 0:
        return None
    lo, hi = pc.min_max(table[key]).values()
    return _Source(lo.as_py(), hi.as_py(), table.num_rows, lambda a, b: _between(table, key, a, b))


def _slices(sources: list[_Source], chunk_rows: int) -> list[tuple[int, int]]:
    """Key ranges [lo, hi] covering every source, each holding about chunk_rows rows."""
    out, lo, rows = [], min(s.lo for s in sources), 0
    for src in sorted(sources, key=lambda s: s.hi):
        rows += src.rows
        if rows >= chunk_rows and src.hi >= lo:
            out.append((lo, src.hi))
            lo, rows = src.hi + 1, 0
    top = max(s.hi for s in sources)
    if lo <= top:
        out.append((lo, top))
    return out


def _write_groups(path: Path, groups: Iterator[pa.Table], run: dict) -> None:
    """`path` written a row group per table of `groups`, each with the `run`'s identity columns
    (parts.run_values), cast to the first one's schema."""
    def write(tmp: Path) -> None:
        writer = None
        try:
            for table in groups:
                table = stamped(table, run)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table.cast(writer.schema) if table.schema != writer.schema else table)
        finally:
            if writer is not None:
                writer.close()

    write_atomic(path, write)


def _merge(path: Path, sources: list[_Source], chunk_rows: int,
           build: Callable[[int, int, list[pa.Table]], pa.Table], run: dict) -> None:
    """`path` written slice by slice: build(lo, hi, each source's rows in [lo, hi], in source order), with
    the `run`'s identity columns."""
    sources = [s for s in sources if s is not None]
    _write_groups(path, (build(lo, hi, [s.read(lo, hi) for s in sources if s.lo <= hi and s.hi >= lo])
                         for lo, hi in _slices(sources, chunk_rows)), run)


def _last_rows(parts: list[pa.Table], key: str) -> pd.DataFrame:
    """The rows of `parts` (in writing order), the last one per key, sorted by key."""
    df = pd.concat([p.to_pandas() for p in parts], ignore_index=True).drop_duplicates(key, keep="last")
    return df.sort_values(key, kind="stable", ignore_index=True)


class GapSpill:
    """float64 values appended to a scratch file, read back in chunks, one pass per `chunks()` call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")

    def add(self, values: np.ndarray) -> None:
        values[~np.isnan(values)].astype(np.float64, copy=False).tofile(self._file)

    def chunks(self) -> Iterator[np.ndarray]:
        self._file.flush()
        with open(self.path, "rb") as f:
            while (chunk := np.fromfile(f, dtype=np.float64, count=SPILL_CHUNK_VALUES)).size:
                yield chunk

    def close(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def merge_requests(view: StoreView, out_dir: Path, schedule: pd.DataFrame | None) -> None:
    """out_dir/requests.parquet: each request's last part row, plus the schedule's unsent rows, by id,
    with every engine_* column (older workers' figures from their bye where a row has none)."""
    sources = [_file_source(p, "request_id") for p in RunDir(out_dir).parts("requests")]
    ids = pa.table({"request_id": schedule["request_id"].to_numpy(np.int64)}) if schedule is not None else None
    unsent = _memory_source(ids, "request_id") if ids is not None else None
    bye = tables.bye_engine_metrics(view)
    keys = sorted(view.engine_keys | {k for m in bye.values() for k in m})
    columns = request.COLUMNS + [tables.engine_column(k) for k in keys]
    t0 = view.t0

    def build(lo: int, hi: int, parts: list[pa.Table]) -> pa.Table:
        sent = [p for p in parts if p.schema.names != ["request_id"]]
        df = _last_rows(sent, "request_id") if sent else None
        if schedule is not None:
            rows = schedule[schedule["request_id"].between(lo, hi)]
            seen = df["request_id"] if df is not None else []
            new = request.with_settings(request.unsent_table(rows, seen), view.settings)
            df = new if df is None else pd.concat([df, new], ignore_index=True).sort_values(
                "request_id", kind="stable", ignore_index=True)
        df = df.reindex(columns=columns)
        if bye:
            _fill_from_bye(df, bye, keys, t0)
        return pa.Table.from_pandas(df, preserve_index=False)

    run = run_values(view.settings)
    if not any(sources) and unsent is None:
        write_parquet(tables.requests_frame(view, [], t0), RunDir(out_dir).table("requests"), run)
        return
    _merge(RunDir(out_dir).table("requests"), [*sources, unsent], REQUEST_CHUNK_ROWS, build, run)


def _fill_from_bye(df: pd.DataFrame, bye: dict[int, dict], keys: list[str], t0: float) -> None:
    """Engine figures from the workers' byes for the rows without any from a BatchDone."""
    names = [tables.engine_column(k) for k in keys]
    bare = df[names].isna().all(axis=1) & df["request_id"].isin(list(bye))
    if bare.any():
        df.loc[bare, names] = tables.engine_columns(df.loc[bare, ["request_id"]].copy(), bye, t0) \
            .reindex(columns=names).to_numpy()


def merge_tokens(out_dir: Path, gaps: GapSpill, run: dict) -> None:
    """out_dir/tokens.parquet from the tokens part files, sorted by request then token index; the
    finished requests' (those of out_dir/requests.parquet) inter-token gaps go to `gaps` in that order
    (metrics.inter_token_latencies')."""
    folder = RunDir(out_dir)
    paths = folder.parts("tokens")
    if not paths:
        write_parquet(tables.frame([], tables.TOKEN_DTYPES), folder.table("tokens"), run)
        return
    metadata = pq.read_schema(paths[0]).metadata
    done = pq.read_table(folder.table("requests"), columns=["request_id", "status"])
    finished = np.sort(done["request_id"].filter(pc.equal(done["status"], RequestStatus.FINISHED.value)).to_numpy())

    def build(lo: int, hi: int, parts: list[pa.Table]) -> pa.Table:
        chunk = pa.concat_tables([p.replace_schema_metadata(metadata) for p in parts]).sort_by(TOKEN_ORDER)
        gaps.add(_sorted_gaps(chunk, finished[np.searchsorted(finished, lo):np.searchsorted(finished, hi, "right")]))
        return chunk

    _merge(folder.table("tokens"), [_file_source(p, "request_id") for p in paths], TOKEN_CHUNK_ROWS, build, run)


def _sorted_gaps(chunk: pa.Table, finished: np.ndarray) -> np.ndarray:
    """metrics.inter_token_latencies over rows already sorted by request and token index, on columns."""
    rids = chunk["request_id"].to_numpy()
    keep = np.isin(rids, finished)
    rids, times = rids[keep], chunk["time"].to_numpy()[keep]
    return (times[1:] - times[:-1])[rids[1:] == rids[:-1]]


def merge_batches(view: StoreView, out_dir: Path) -> None:
    """out_dir/batches.parquet: each batch's last part row, by batch id."""
    folder, run = RunDir(out_dir), run_values(view.settings)
    paths = folder.parts("batches")
    if not paths:
        write_parquet(tables.batches_frame(view, [], view.t0), folder.table("batches"), run)
        return
    _merge(folder.table("batches"), [_file_source(p, "batch_id") for p in paths], REQUEST_CHUNK_ROWS,
           lambda lo, hi, parts: pa.Table.from_pandas(_last_rows(parts, "batch_id"), preserve_index=False), run)


def merge_steps(out_dir: Path, run: dict) -> None:
    """out_dir/steps.parquet from the steps part files, in order, with the run's identity columns (none
    when no step arrived)."""
    paths = RunDir(out_dir).parts("steps")
    if not paths:
        return
    metadata = pq.read_schema(paths[0]).metadata

    def groups() -> Iterator[pa.Table]:  # a row group of many parts: fewer headers
        held = []
        for i, path in enumerate(paths):
            held.append(pq.read_table(path).replace_schema_metadata(metadata))
            if sum(t.num_rows for t in held) >= STEP_CHUNK_ROWS or i == len(paths) - 1:
                yield pa.concat_tables(held)
                held = []

    _write_groups(RunDir(out_dir).table("steps"), groups(), run)


def summary_from_files(view: StoreView, out_dir: Path, slos: dict | None, gaps: GapSpill) -> Summary:
    """build_tables' summary, from requests.parquet read in slices and the inter-token gaps in `gaps`."""
    path = RunDir(out_dir).table("requests")
    figures = RequestFigures(slos)
    for batch in pq.ParquetFile(path).iter_batches(batch_size=REQUEST_CHUNK_ROWS, columns=SUMMARY_COLUMNS):
        figures.add(batch.to_pandas())
    itl = chunked_percentiles(gaps.chunks, LATENCY_STATS)
    cached = [c for c in ("prompt_len", "engine_cached_tokens") if c in pq.read_schema(path).names]
    prefix = tables.prefix_cache(pd.read_parquet(path, columns=cached))
    return Summary.model_validate(figures.summary(view.settings, itl) | tables.run_facts(view) | prefix)


def merge_run(view: StoreView, out_dir: Path, slos: dict | None) -> Tables:
    """Every final table file merged from the part files (the store's last rows must be in them); the
    summary. Every table in the result is None: they are on disk."""
    out_dir = Path(out_dir)
    merge_requests(view, out_dir, read_schedule(out_dir))
    gaps, run = GapSpill(RunDir(out_dir).gaps), run_values(view.settings)
    try:
        merge_tokens(out_dir, gaps, run)
        merge_batches(view, out_dir)
        merge_steps(out_dir, run)
        summary = summary_from_files(view, out_dir, slos, gaps)
    finally:
        gaps.close()
    return Tables(None, None, None, None, summary)
