"""Production traces: when each request arrived, and its input and output length in tokens.

Built in (traffic/data/azure-llm-2023, CC-BY 4.0; see the README there): `azure-conv` and `azure-code`.
A user's trace (`trace:PATH`, or any PATH ending .csv / .csv.gz, or a .jsonl whose first record has a
timestamp and an input length): one request per CSV row or JSONL line, its columns and their accepted
names as docs/traffic.md lists them (INPUT_KEYS, OUTPUT_KEYS; any case, spaces or underscores). Rows are
sorted by time; rows with a zero length (BurstGPT's failed requests) are skipped and counted; anything
else unreadable is one DatasetError naming the file and line.
"""
import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NoReturn

import numpy as np
import pandas as pd

from batchlab.traffic.datasets import DatasetError

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).parent / "data" / "azure-llm-2023"
BUILTIN_TRACES = {"azure-conv": DATA_DIR / "AzureLLMInferenceTrace_conv.csv.gz",
                  "azure-code": DATA_DIR / "AzureLLMInferenceTrace_code.csv.gz"}
TRACE_PREFIX = "trace:"
CSV_SUFFIXES = (".csv", ".csv.gz")
TIME_KEYS = ("timestamp", "time", "arrivaltime", "arrival", "ts", "createdat")
TIME_MS_KEYS = ("timestampms", "timems", "arrivaltimems", "tsms")
INPUT_KEYS = ("contexttokens", "inputlen", "inputlength", "inputtokens", "numinputtokens", "promptlen",
              "promptlength", "prompttokens", "numprompttokens", "requesttokens")
OUTPUT_KEYS = ("generatedtokens", "outputlen", "outputlength", "outputtokens", "numoutputtokens",
               "completiontokens", "numcompletiontokens", "responsetokens", "genlen")
MOONCAKE_KEY = "hash_ids"  # Mooncake's JSONL: its `timestamp` counts milliseconds


@dataclass(slots=True)
class Trace:
    """A trace's requests in arrival order (read-only arrays of equal length)."""

    name: str
    offsets_s: np.ndarray  # [n] float64, sorted; seconds since the first request (offsets_s[0] = 0)
    input_lens: np.ndarray  # [n] int64, >= 1
    output_lens: np.ndarray  # [n] int64, >= 1
    skipped: int = 0  # rows left out for a zero length

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.offsets_s)

    @property
    def span_s(self) -> float:
        """The trace covers [0, span_s): its last arrival plus one mean gap."""
        last = float(self.offsets_s[-1])
        return last + (last / (self.n_requests - 1) if self.n_requests > 1 and last > 0 else 1.0)


def _key(name: str) -> str:
    """A column name reduced to lowercase letters and digits ("Request tokens" -> "requesttokens")."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _trace_path(dataset: str) -> Path | None:
    """The file a dataset name points at if it names a trace, else None (no file is opened here)."""
    if dataset in BUILTIN_TRACES:
        return BUILTIN_TRACES[dataset]
    if dataset.startswith(TRACE_PREFIX):
        return Path(dataset[len(TRACE_PREFIX):]).expanduser()
    path = Path(dataset).expanduser()
    return path if path.name.lower().endswith(CSV_SUFFIXES) else None


def is_trace_dataset(dataset: str) -> bool:
    """Whether `dataset` names a trace (built-in, trace:PATH, a CSV, or a JSONL of trace records)."""
    if _trace_path(dataset) is not None:
        return True
    path = Path(dataset).expanduser()
    return path.suffix.lower() == ".jsonl" and path.is_file() and _looks_like_trace_jsonl(path)


def _looks_like_trace_jsonl(path: Path) -> bool:
    """The first non-blank line is a JSON object with a timestamp and an input length."""
    try:
        with path.open(encoding="utf-8") as f:
            line = next((ln for ln in f if ln.strip()), "")
        record = json.loads(line)
    except (OSError, UnicodeError, ValueError):
        return False
    keys = {_key(k) for k in record} if isinstance(record, dict) else set()
    return bool(keys & {*TIME_KEYS, *TIME_MS_KEYS}) and bool(keys & set(INPUT_KEYS))


def load_trace(dataset: str) -> Trace:
    """The trace `dataset` names (see the module docstring); DatasetError if it cannot be used."""
    path = _trace_path(dataset) or Path(dataset).expanduser()
    if not path.is_file():
        raise DatasetError(f"trace file not found: {path}")
    st = path.stat()
    return _load_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, dataset)


@lru_cache(maxsize=8)
def _load_cached(path: str, size: int, mtime_ns: int, name: str) -> Trace:
    """Parse once per file version: a sweep builds many schedules from one trace."""
    del size, mtime_ns  # cache key only
    source = Path(path)
    try:
        trace = _read_jsonl(source, name) if source.suffix.lower() == ".jsonl" else _read_csv(source, name)
    except (OSError, UnicodeError, EOFError) as exc:
        raise DatasetError(f"cannot read trace {source}: {exc}") from None
    log.info("trace %s: %d requests over %.0f s (%d rows skipped)", name, trace.n_requests, trace.span_s,
             trace.skipped)
    return trace


def _read_csv(path: Path, name: str) -> Trace:
    """A trace from a CSV file with a header row."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise DatasetError(f"trace {path} is not a readable CSV file: {' '.join(str(exc).split())}") from None
    if frame.empty:
        raise DatasetError(f"trace {path} holds no records (only a header)")
    lines = np.arange(len(frame)) + 2  # line 1 is the header
    return _build(path, name, {c: frame[c] for c in frame.columns}, lines, mooncake=False)


def _read_jsonl(path: Path, name: str) -> Trace:
    """A trace from a JSONL file: one object per non-blank line."""
    records, lines = [], []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                raise DatasetError(f"trace {path} line {number}: not a JSON object")
            records.append(record)
            lines.append(number)
    if not records:
        raise DatasetError(f"trace {path} holds no records")
    columns = {k: pd.Series([r.get(k) for r in records], dtype=object) for k in records[0]}
    return _build(path, name, columns, np.asarray(lines), mooncake=MOONCAKE_KEY in records[0])


def _build(path: Path, name: str, columns: dict[str, pd.Series], lines: np.ndarray, *, mooncake: bool) -> Trace:
    """Validate the three columns, sort by time, skip zero lengths."""
    by_key = {_key(c): c for c in columns}
    time_col, ms = _find(path, by_key, TIME_MS_KEYS), True
    if time_col is None:
        time_col, ms = _find(path, by_key, TIME_KEYS, "timestamp"), mooncake
    in_col, out_col = _find(path, by_key, INPUT_KEYS, "input length"), _find(path, by_key, OUTPUT_KEYS, "output length")
    times_s = _times_s(path, columns[time_col], lines, time_col, ms)
    inputs = _lengths(path, columns[in_col], lines, in_col)
    outputs = _lengths(path, columns[out_col], lines, out_col)
    keep = (inputs > 0) & (outputs > 0)
    if not keep.any():
        raise DatasetError(f"trace {path} has no request with input and output lengths >= 1")
    order = np.argsort(times_s[keep], kind="stable")
    times_s = times_s[keep][order]
    arrays = [times_s - times_s[0], inputs[keep][order], outputs[keep][order]]
    for a in arrays:
        a.flags.writeable = False  # shared by every schedule built from the cached trace
    return Trace(name, *arrays, skipped=int((~keep).sum()))


def _find(path: Path, by_key: dict[str, str], keys: tuple[str, ...], what: str = "") -> str | None:
    """The column whose name matches one of `keys`; None (or, given `what`, DatasetError) if none."""
    found = next((by_key[key] for key in keys if key in by_key), None)
    if found is not None or not what:
        return found
    raise DatasetError(f"trace {path} has no {what} column: expected one of {', '.join(keys)} (any case, "
                       f"spaces or underscores); found {', '.join(map(str, by_key.values()))}")


def _first_bad(path: Path, bad: np.ndarray, lines: np.ndarray, column: str, values: pd.Series,
               want: str) -> NoReturn:
    """DatasetError naming the first row where `bad` holds."""
    i = int(np.flatnonzero(bad)[0])
    raise DatasetError(f"trace {path} line {lines[i]}: {column} {values.iloc[i]!r} is not {want}")


def _lengths(path: Path, values: pd.Series, lines: np.ndarray, column: str) -> np.ndarray:
    """Whole token counts >= 0 as int64."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(numbers) | (numbers < 0) | (numbers != np.floor(numbers))
    if bad.any():
        _first_bad(path, bad, lines, column, values, "a whole number of tokens >= 0")
    return numbers.astype(np.int64)


def _times_s(path: Path, values: pd.Series, lines: np.ndarray, column: str, ms: bool) -> np.ndarray:
    """Arrival times in seconds (float64, any origin): numbers (ms when `ms`), or ISO date-times."""
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isfinite(numbers[0]):
        bad = ~np.isfinite(numbers)
        if bad.any():
            _first_bad(path, bad, lines, column, values, "a number of seconds")
        return numbers / 1000.0 if ms else numbers
    stamps = pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")
    bad = stamps.isna().to_numpy()
    if bad.any():
        _first_bad(path, bad, lines, column, values, "a time (seconds, or an ISO date-time)")
    return (stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=np.float64)
