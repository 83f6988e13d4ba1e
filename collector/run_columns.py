"""A run's identity as constant columns of every table it writes, so that a sweep's tables, read as
one, still say which run each row came from: its label, strategy and parameters, backend, model, rate,
seed, repeat and config hash (protocol.identity). The collector adds them at its final write; text
columns are dictionary-encoded (one value, and an index of zeros that Parquet stores run-length encoded).
"""
import json

import numpy as np
import pyarrow as pa

from batchlab.protocol.identity import config_hash, identity
from batchlab.protocol.settings import vllm_rule

# requests.parquet had these before the others (as plain columns); every table carries all of them
SETTINGS_COLUMNS = ("strategy", "backend", "model", "rate", "concurrency", "arrival", "seed")
RUN_COLUMNS = ("label", "strategy_args", "repeat", "config_hash")
TYPES = {"rate": pa.float64(), "concurrency": pa.int64(), "seed": pa.int64(), "repeat": pa.int64()}  # the others: text
TEXT = pa.dictionary(pa.int32(), pa.string())


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
