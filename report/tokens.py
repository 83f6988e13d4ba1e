"""A run's tokens table reduced to what the report reads from it, a slice of rows at a time.

The report needs of a run's tokens only its inter-token gaps (ITL, the tools' formulas, the ITL plot), each
request's first and last token time (GuideLLM's ITL) and, where the run's steps record prompt tokens, whether
the step that produced each gap's later token carried some (stats.split). tokens.parquet holds a row per token
(33.8 M rows for a minute at 5,000 req/s): read whole into pandas, with the sorts and merges over it, the
report took 3.9 GiB. `read_digest` reads the final file CHUNK_ROWS rows at a time in its (request_id,
token_index) order (collector.merge writes it so) and keeps 8 bytes a gap (9 with the step flags) and a few
numbers a request, in blocks of whole requests; the statistics over the gaps go a block at a time
(stats.quantiles.chunked_percentiles: exact, in bounded memory). A table that is not in that order (a
killed run's part files, a file another program wrote) is read whole and sorted first, as
metrics.inter_token_latencies does.
"""
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.collector.parts import load_table
from batchlab.protocol.run_dir import RunDir

CHUNK_ROWS = 1 << 19
COLUMNS = ["request_id", "token_index", "time"]
NA, PLAIN, CARRIED = -1, 0, 1  # a gap's step flag: no step holds its later token / decode only / prompt tokens


@dataclass(slots=True)
class Block:
    """Whole requests' tokens (ascending id): each one's first and last token time and gap count, their gaps
    in (request, token index) order and each gap's step flag (None: not known)."""

    request_ids: np.ndarray  # int64
    first: np.ndarray  # float64, s
    last: np.ndarray  # float64, s
    gap_counts: np.ndarray  # int64: tokens − 1
    gaps: np.ndarray  # float64, s
    flags: np.ndarray | None  # int8 per gap: NA, PLAIN or CARRIED

    def mask(self, request_ids: np.ndarray) -> np.ndarray:
        """Per gap: whether its request is among `request_ids` (int64)."""
        return np.repeat(np.isin(self.request_ids, request_ids), self.gap_counts)


@dataclass(slots=True)
class TokenDigest:
    """A run's tokens as the report reads them: blocks of whole requests."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def n_gaps(self) -> int:
        """Every gap, of every request."""
        return sum(len(b.gaps) for b in self.blocks)

    def itl_chunks(self, request_ids: object = None) -> Iterator[np.ndarray]:
        """The gaps (s, NaN left out) of these requests (None: all), a block at a time."""
        ids = None if request_ids is None else np.asarray(request_ids, dtype=np.int64)
        for b in self.blocks:
            gaps = b.gaps if ids is None else b.gaps[b.mask(ids)]
            yield gaps[~np.isnan(gaps)]

    def spans(self) -> pd.Series:
        """Last − first token time (s) per request id."""
        if not self.blocks:
            return pd.Series(dtype="float64")
        return pd.Series(np.concatenate([b.last - b.first for b in self.blocks]),
                         index=np.concatenate([b.request_ids for b in self.blocks]))


class StepFlags:
    """Whether the step that produced a token carried prompt tokens: its worker's step whose span holds the
    token's time (the worker is its request's, from the requests table); NA where no step holds it."""

    def __init__(self, requests: pd.DataFrame, steps: pd.DataFrame) -> None:
        order = steps.sort_values("start_time", kind="stable")
        self.steps = {w: (own["start_time"].to_numpy(dtype="float64"), own["end_time"].to_numpy(dtype="float64"),
                          own["prefill_tokens"].to_numpy() > 0)
                      for w, own in order.groupby("worker", sort=False, observed=True)}
        codes = {w: k for k, w in enumerate(self.steps)}
        known = requests.dropna(subset=["request_id"]).drop_duplicates("request_id", keep="last")
        ids = known["request_id"].to_numpy(dtype="int64")
        sort = np.argsort(ids, kind="stable")
        self.ids = ids[sort]
        self.codes = np.array([codes.get(w, -1) for w in known["worker"].to_numpy(dtype=object)],
                              dtype=np.int64)[sort]

    def __call__(self, request_ids: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Each token's flag (NA, PLAIN, CARRIED), given its request id and time."""
        out = np.full(len(times), NA, dtype=np.int8)
        if not len(self.ids):
            return out
        pos = np.clip(np.searchsorted(self.ids, request_ids), 0, len(self.ids) - 1)
        code = np.where(self.ids[pos] == request_ids, self.codes[pos], -1)
        for k, (start, end, prompt) in enumerate(self.steps.values()):
            mine = code == k
            if not (mine.any() and len(start)):
                continue
            t = times[mine]
            i = np.searchsorted(start, t, side="right") - 1
            j = np.clip(i, 0, None)
            out[mine] = np.where((i >= 0) & (t <= end[j]), np.where(prompt[j], CARRIED, PLAIN), NA)
        return out


def starts_of(values: np.ndarray) -> np.ndarray:
    """Where each run of equal consecutive values starts (the first index is 0)."""
    return np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))


def flags_for(requests: pd.DataFrame, steps: pd.DataFrame) -> StepFlags | None:
    """The step flags of a run whose steps say which carried prompt tokens, else None."""
    if steps.empty or not {"worker", "prefill_tokens", "start_time", "end_time"} <= set(steps) \
            or "worker" not in requests:
        return None
    return StepFlags(requests, steps)


def _block(rid: np.ndarray, times: np.ndarray, flags: StepFlags | None) -> Block:
    """Whole requests' rows, in order, as a block."""
    starts = starts_of(rid)
    same = rid[1:] == rid[:-1]
    return Block(rid[starts], np.minimum.reduceat(times, starts), np.maximum.reduceat(times, starts),
                 np.diff(np.append(starts, len(rid))) - 1, np.diff(times)[same],
                 None if flags is None else flags(rid[1:][same], times[1:][same]))


def digest(chunks: Iterator[pd.DataFrame], flags: StepFlags | None = None, ordered: bool = False) -> TokenDigest | None:
    """Reduce tokens given in (request_id, token_index) order, a frame at a time; None when they are not in it
    (`ordered`: sorted here, a token index given twice kept as it is). A chunk's last request waits for the next
    chunk (its tokens may go on there): blocks hold whole requests."""
    out = TokenDigest()
    held = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0))  # the last request's rows so far
    for frame in chunks:
        if frame.empty:
            continue
        rid, index, times = (np.concatenate([h, frame[c].to_numpy(dtype=h.dtype)])
                             for h, c in zip(held, COLUMNS))
        same = rid[1:] == rid[:-1]
        if not (ordered or np.all((rid[1:] > rid[:-1]) | (same & (index[1:] > index[:-1])))):
            return None
        cut = int(starts_of(rid)[-1])  # where the last request starts
        if cut:
            out.blocks.append(_block(rid[:cut], times[:cut], flags))
        held = (rid[cut:], index[cut:], times[cut:])
    if len(held[0]):
        out.blocks.append(_block(held[0], held[2], flags))
    return out


def frame_digest(tokens: pd.DataFrame, flags: StepFlags | None = None) -> TokenDigest:
    """A tokens frame's digest, in any row order (a stable sort when it is not in order)."""
    in_order = digest(iter([tokens]), flags)
    if in_order is not None:
        return in_order
    order = np.lexsort((tokens["token_index"].to_numpy(), tokens["request_id"].to_numpy()))
    return digest(iter([tokens.iloc[order]]), flags, ordered=True)


def read_digest(folder: Path, check: Callable[[pd.DataFrame], None], flags: StepFlags | None = None,
                chunk_rows: int = CHUNK_ROWS) -> TokenDigest:
    """A run folder's tokens digest: its final tokens.parquet a slice at a time, each slice `check`ed (it raises
    on a bad one); a table not in order, or only part files (a killed run), read whole and sorted."""
    final = RunDir(folder).table("tokens")
    if final.exists():
        source = pq.ParquetFile(final)
        columns = [c for c in COLUMNS if c in source.schema_arrow.names]

        def slices() -> Iterator[pd.DataFrame]:
            read = False
            for batch in source.iter_batches(batch_size=chunk_rows, columns=columns):
                frame, read = batch.to_pandas(), True
                del batch
                pa.default_memory_pool().release_unused()  # the slice's Arrow buffers: not kept for reuse
                check(frame)
                yield frame
            if not read:  # no row: its columns are still checked
                check(source.schema_arrow.empty_table().select(columns).to_pandas())

        in_order = digest(slices(), flags)
        if in_order is not None:
            return in_order
    tokens = load_table(folder, "tokens", columns=COLUMNS)
    check(tokens)
    return frame_digest(tokens, flags)
