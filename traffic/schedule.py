"""The seeded schedule of a run: when each request arrives and what it asks (synthetic, from a dataset, or
from a trace: its arrival times or generated ones, with its input and output lengths); saved and replayed."""
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.protocol.messages import pack_tokens
from batchlab.protocol.run_dir import NOTES_KEY, footer_notes
from batchlab.traffic.arrivals import arrival_offsets, trace_window
from batchlab.traffic.config import TRACE_ARRIVAL, TrafficConfig
from batchlab.traffic.datasets import DatasetError, load_conversations, load_sharegpt
from batchlab.traffic.prompts import Prompts, Tokenizer, exact_length_prompts, sharegpt_prompts, synthetic_prompts
from batchlab.traffic.schedule_file import META_CONFIG, META_DURATION, META_HASH, read_file
from batchlab.traffic.traces import Trace, is_trace_dataset, load_trace

SCHEMA = pa.schema([  # a planned request: a schedule.parquet row; traffic sends each as a RequestMsg
    ("request_id", pa.int64()), ("arrival_offset_s", pa.float64()), ("prompt", pa.string()),
    ("prompt_len", pa.int64()), ("output_len", pa.int64()), ("prompt_tokens", pa.list_(pa.int32())),
])
COLUMNS = tuple(SCHEMA.names)
_HASH_TAG = b"batchlab-schedule-v1"
HASH_ROWS = 4096  # prompts hashed per slice (bounds the flat copy's memory)
SAVE_ROWS = 16_384  # rows written per row group (bounds the Arrow copy of their prompts)


@dataclass(slots=True)
class Schedule:
    """Requests in arrival order (a DataFrame with COLUMNS), its content hash and planned duration."""

    frame: pd.DataFrame
    content_hash: str  # sha256 hex over offsets, prompt tokens and output lengths
    duration_s: float
    config: TrafficConfig | None = None  # None when loaded from a file without a readable config
    # how it was made, for the summary (JSON-able, not covered by the hash): prompt_source (a
    # prompts.PROMPT_SOURCES key), capped_prompts, capped_outputs; from a trace also trace_requests,
    # trace_skipped_rows, and trace_window_s, trace_speedup, trace_native_rate (arrival "trace") or
    # trace_first_request (generated arrivals)
    notes: dict = field(default_factory=dict)

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.frame)

    def requests(self) -> Iterator[tuple[int, float, int, int, bytes]]:
        """Every request in order: request_id, arrival offset s, prompt_len, output_len and its prompt packed
        as the wire carries it (as traffic.saved_schedule.SavedSchedule gives them from a file)."""
        frame = self.frame
        for row in zip(*(frame[c].tolist() for c in ("request_id", "arrival_offset_s", "prompt_len", "output_len")),
                       frame["prompt_tokens"]):
            yield (*row[:4], pack_tokens(row[4]))


def content_hash(offsets_s: np.ndarray, tokens: Sequence[Sequence[int]], output_lens: np.ndarray) -> str:
    """sha256 (hex) over a canonical little-endian encoding of offsets, prompt tokens and output lengths
    (each prompt's tokens: a list of ints, or an array)."""
    prompt_lens = np.fromiter(map(len, tokens), dtype="<i8", count=len(tokens))

    def flat_slices() -> Iterator[np.ndarray]:  # the flat tokens, a slice of prompts at a time
        for start in range(0, len(tokens), HASH_ROWS):
            rows = tokens[start:start + HASH_ROWS]
            if all(isinstance(row, np.ndarray) for row in rows):  # synthetic prompts: joined, ~5× faster than
                yield np.concatenate(rows).astype("<i8", copy=False)  # one Python int at a time; the same bytes
            else:
                yield np.fromiter(itertools.chain.from_iterable(rows), dtype="<i8", count=int(sum(map(len, rows))))

    return digest(len(tokens), [offsets_s], [prompt_lens], [output_lens], flat_slices())


def digest(n: int, offsets_s: Iterable[np.ndarray], prompt_lens: Iterable[np.ndarray],
           output_lens: Iterable[np.ndarray], flat_tokens: Iterable[np.ndarray]) -> str:
    """content_hash from its parts, each column given in consecutive slices (so a file can be hashed a batch of
    rows at a time: traffic.saved_schedule): the same bytes in the same order give the same digest."""
    h = hashlib.sha256(_HASH_TAG)
    h.update(np.int64(n).astype("<i8").tobytes())
    for slices, dtype in ((offsets_s, "<f8"), (prompt_lens, "<i8"), (output_lens, "<i8"), (flat_tokens, "<i8")):
        for part in slices:
            h.update(np.asarray(part, dtype=dtype).tobytes())
    return h.hexdigest()


def _token_arrays(column: pa.ChunkedArray) -> list[np.ndarray]:
    """A list<int> column as one int32 array per row: views into the Arrow buffer, no Python ints."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    flat = array.flatten().to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    offsets = array.offsets.to_numpy()
    bounds = offsets - offsets[0]
    return [flat[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def _make_frame(offsets_s: np.ndarray, prompts: Prompts) -> pd.DataFrame:
    """The schedule DataFrame from its columns."""
    n = len(offsets_s)
    return pd.DataFrame({
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_offset_s": np.asarray(offsets_s, dtype=np.float64),
        "prompt": pd.Series(prompts.texts, dtype=object),
        "prompt_len": np.fromiter(map(len, prompts.tokens), dtype=np.int64, count=n),
        "output_len": np.asarray(prompts.output_lens, dtype=np.int64),
        "prompt_tokens": pd.Series(prompts.tokens, dtype=object),
    }, columns=list(COLUMNS))


def _prompts(cfg: TrafficConfig, n: int, tokenizer: Tokenizer | None, rng: np.random.Generator) -> Prompts:
    """Prompts for `n` requests from the configured source."""
    if cfg.dataset == "synthetic":
        return synthetic_prompts(n, cfg, rng)
    if tokenizer is None:
        raise ValueError(f"dataset {cfg.dataset!r} needs a tokenizer")
    pairs = load_sharegpt() if cfg.dataset == "sharegpt" else load_conversations(cfg.dataset)
    return sharegpt_prompts(pairs, n, tokenizer, cfg, rng)


def build_schedule(cfg: TrafficConfig, tokenizer: Tokenizer | None) -> Schedule:
    """Seeded schedule: offsets from default_rng([seed, 0]), prompts from default_rng([seed, 1]).

    The two streams are separate, so request k gets the same prompt at any rate or arrival kind.
    `tokenizer` may be None for the synthetic dataset, and for a trace (its prompts are then random ids).
    """
    cfg.check()
    if is_trace_dataset(cfg.dataset):
        offsets, prompts, notes = _first(cfg.num_requests, *trace_requests(cfg, tokenizer))
    else:
        offsets = arrival_offsets(cfg.arrival, cfg.rate, cfg.duration_s, np.random.default_rng([cfg.seed, 0]),
                                  burstiness=cfg.burstiness, count=cfg.num_requests)
        prompts, notes = _prompts(cfg, len(offsets), tokenizer, np.random.default_rng([cfg.seed, 1])), {}
    notes = {"prompt_source": prompts.source, "capped_prompts": prompts.capped_prompts,
             "capped_outputs": prompts.capped_outputs, **notes}
    digest = content_hash(offsets, prompts.tokens, np.asarray(prompts.output_lens))
    return Schedule(_make_frame(offsets, prompts), digest, float(cfg.duration_s), cfg, notes)


def _first(n: int, offsets: np.ndarray, prompts: Prompts, notes: dict) -> tuple[np.ndarray, Prompts, dict]:
    """A trace's first `n` requests (all of them when n is 0 or more than it holds)."""
    if n <= 0 or n >= len(offsets):
        return offsets, prompts, notes
    kept = Prompts(prompts.texts[:n], prompts.tokens[:n], prompts.output_lens[:n], prompts.source,
                   prompts.capped_prompts, prompts.capped_outputs)
    return offsets[:n], kept, {**notes, "trace_requests": n}


def trace_requests(cfg: TrafficConfig, tokenizer: Tokenizer | None) -> tuple[np.ndarray, Prompts, dict]:
    """(arrival offsets, prompts, notes) for a trace dataset; offsets from default_rng([seed, 0]) when
    generated, prompt ids from default_rng([seed, 1]), as for every dataset.

    arrival "trace": the window arrivals.trace_window picks. Another arrival kind: its generated times,
    and request k gets the lengths of the trace's k-th request from trace_start_s (cycling at the end).
    """
    trace = load_trace(cfg.dataset)
    if cfg.arrival == TRACE_ARRIVAL:
        offsets, picked, notes = _windowed(trace, cfg)
    else:
        offsets = arrival_offsets(cfg.arrival, cfg.rate, cfg.duration_s, np.random.default_rng([cfg.seed, 0]),
                                  burstiness=cfg.burstiness)
        picked, notes = _lengths_only(trace, cfg, len(offsets))
    pairs = load_sharegpt() if tokenizer is not None else None
    prompts = exact_length_prompts(trace.input_lens[picked], trace.output_lens[picked], cfg, pairs, tokenizer,
                                   np.random.default_rng([cfg.seed, 1]))
    notes.update(trace_requests=len(picked), trace_skipped_rows=trace.skipped)
    return offsets, prompts, notes


def _windowed(trace: Trace, cfg: TrafficConfig) -> tuple[np.ndarray, np.ndarray, dict]:
    """The trace's own arrivals in the configured window (rescaled to cfg.rate unless it is 0)."""
    window = trace_window(trace.offsets_s, trace.span_s, cfg.trace_start_s, cfg.duration_s, cfg.rate)
    n = len(window.offsets_s)
    notes = {"trace_window_s": [float(window.start_s), float(window.end_s)], "trace_speedup": window.speedup,
             "trace_native_rate": n / (window.end_s - window.start_s)}
    return window.offsets_s, np.arange(window.first, window.first + n), notes


def _lengths_only(trace: Trace, cfg: TrafficConfig, n: int) -> tuple[np.ndarray, dict]:
    """Indices of the trace requests whose lengths `n` generated arrivals take."""
    if not cfg.trace_start_s < trace.span_s:
        raise ValueError(f"trace start {cfg.trace_start_s:g} s is past the trace's end ({trace.span_s:.0f} s)")
    first = int(np.searchsorted(trace.offsets_s, cfg.trace_start_s, side="left")) % trace.n_requests
    return (first + np.arange(n)) % trace.n_requests, {"trace_first_request": first}


def with_send_times(schedule: Schedule, offsets_s: Sequence[float]) -> Schedule:
    """The schedule's first len(offsets_s) requests with these arrival offsets (when a closed loop's
    clients sent them), its hash recomputed: what was sent, as it was sent."""
    frame = schedule.frame.iloc[:len(offsets_s)].copy()
    frame["arrival_offset_s"] = np.asarray(offsets_s, dtype=np.float64)
    digest = content_hash(frame["arrival_offset_s"].to_numpy(), list(frame["prompt_tokens"]),
                          frame["output_len"].to_numpy())
    notes = {**schedule.notes, "arrivals": "closed loop: when each client sent"}
    return Schedule(frame.reset_index(drop=True), digest, schedule.duration_s, schedule.config, notes)


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    """Write the schedule as Parquet, SAVE_ROWS rows at a time (a row's prompt text and tokens are copied into
    Arrow only for its slice: the frame's rows share the dataset's objects, the file's do not); hash, duration
    and config go into the file's key-value metadata."""
    config = schedule.config.to_dict() if schedule.config is not None else None
    schema = SCHEMA.with_metadata({
        META_HASH: schedule.content_hash.encode(),
        META_DURATION: repr(float(schedule.duration_s)).encode(),
        META_CONFIG: json.dumps(config).encode(),
        NOTES_KEY: json.dumps(schedule.notes).encode(),
    })
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    frame = schedule.frame[list(COLUMNS)]
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, max(len(frame), 1), SAVE_ROWS):  # an empty schedule: one empty slice
            part = frame.iloc[start:start + SAVE_ROWS]
            writer.write_table(pa.Table.from_pandas(part, schema=SCHEMA, preserve_index=False))


def _read_table(path: Path) -> tuple[pa.Table, dict[bytes, bytes]]:
    """The Parquet table and its metadata, or DatasetError."""
    table = read_file(path, lambda p: pq.ParquetFile(p).read())
    meta = table.schema.metadata or {}
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing or META_HASH not in meta:
        raise DatasetError(f"{path} is not a batchlab schedule (missing {missing or 'its hash'})")
    return table, meta


def _read_config(meta: dict[bytes, bytes]) -> TrafficConfig | None:
    """The saved TrafficConfig, or None if absent or unreadable."""
    try:
        data = json.loads(meta.get(META_CONFIG, b"null"))
        return TrafficConfig.from_dict(data) if data else None
    except (ValueError, TypeError):
        return None


def saved_notes(path: str | Path) -> dict:
    """A saved schedule's notes (Schedule.notes) from the file's footer alone; {} if it has none."""
    return footer_notes(read_file(Path(path), pq.read_metadata).metadata or {})


def saved_settings(path: str | Path) -> tuple[dict, bool]:
    """(settings, exact) from the file's footer alone: the TrafficConfig the schedule was built with
    (exact; TrafficConfig.settings, length specs as text), or for a file saved without it what its rows tell: duration_s and the mean rate n / duration_s."""
    path = Path(path)
    footer = read_file(path, pq.read_metadata)
    meta = footer.metadata or {}
    if META_HASH not in meta:
        raise DatasetError(f"{path} is not a batchlab schedule (missing its hash)")
    config = _read_config(meta)
    if config is not None:
        return config.settings(), True
    duration_s = float(meta[META_DURATION]) if META_DURATION in meta else _last_offset_s(path)
    return {"duration_s": duration_s, **({"rate": footer.num_rows / duration_s} if duration_s > 0 else {})}, False


def _last_offset_s(path: Path) -> float:
    """The latest planned arrival (the duration of a schedule saved without one)."""
    offsets = pq.read_table(path, columns=["arrival_offset_s"]).column(0).to_numpy()
    return float(offsets.max(initial=0.0))


def _consistent(frame: pd.DataFrame, tokens: list[list[int]]) -> bool:
    """request_id is 0..n-1 and prompt_len matches the tokens (neither is covered by the hash)."""
    n = len(tokens)
    lens = np.fromiter(map(len, tokens), dtype=np.int64, count=n)
    return (np.array_equal(frame["request_id"].to_numpy(), np.arange(n))
            and np.array_equal(frame["prompt_len"].to_numpy(), lens))


def load_schedule(path: str | Path) -> Schedule:
    """Read a saved schedule for replay; the hash is recomputed and a mismatch raises DatasetError."""
    path = Path(path)
    table, meta = _read_table(path)
    tokens = _token_arrays(table.column("prompt_tokens"))
    frame = table.drop_columns(["prompt_tokens"]).to_pandas()
    frame["prompt"] = frame["prompt"].astype(object)
    frame["prompt_tokens"] = pd.Series(tokens, dtype=object)
    frame = frame[list(COLUMNS)]
    expected = meta[META_HASH].decode()
    actual = content_hash(frame["arrival_offset_s"].to_numpy(), tokens, frame["output_len"].to_numpy())
    if actual != expected or not _consistent(frame, tokens):
        raise DatasetError(f"schedule {path} fails its integrity check (stored hash {expected[:12]}..., "
                           f"content hash {actual[:12]}...); it was modified or damaged")
    offsets = frame["arrival_offset_s"].to_numpy()
    duration_s = float(meta[META_DURATION]) if META_DURATION in meta else float(offsets.max(initial=0.0))
    return Schedule(frame, actual, duration_s, _read_config(meta), footer_notes(meta))
