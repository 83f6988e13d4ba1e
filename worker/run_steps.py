"""The steps a live worker executed, read back from a run folder's tables, in the step model's terms.

Each executed step becomes one row of a steps frame (STEP_COLUMNS): its worker, start and end (s since
t0), and the shape the step model prices (worker.stepmodel): decode rows and the context they attend
over, prefill rows, tokens and Σ prompt_len². The shape is counted the way the simulator counts it
(worker.sim), so a fit to these rows is a fit of the simulator's own formula; docs/simulator.md ("How
the steps are read") gives the rules for a static batch and for a continuous step.

The tokens frame comes back with a `step` column (the row of the steps frame that yielded it), for replays.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.protocol.run_dir import RunDir
from batchlab.worker.hf.chunks import pads_chunks

STEP_COLUMNS = ("worker", "start_s", "end_s", "decode_rows", "decode_context", "prefill_rows", "prefill_tokens",
                "prefill_pairs")
TIME_SLACK_S = 1e-6  # token stamps and step ends are the same clock reading, written as floats
# The columns the steps are read from, and their kinds ("number": ints or floats; "text"; "flag": booleans).
NEEDED: dict[str, dict[str, str]] = {
    "requests": {"request_id": "number", "prompt_len": "number"},
    "batches": {"batch_id": "number", "worker": "text", "size": "number", "max_prompt_len": "number",
                "oom": "flag", "scheduled_time": "number"},
    "tokens": {"request_id": "number", "batch_id": "number", "token_index": "number", "time": "number"},
    "steps": {"worker": "text", "step": "number", "start_time": "number", "end_time": "number",
              "prefill_tokens": "number"},
}


class RunStepsError(ValueError):
    """A run folder whose tables cannot give its steps: the message names the file and what is wrong."""


@dataclass(slots=True)
class RunSteps:
    """One run's executed steps, its tokens (with the step of each) and its requests."""

    steps: pd.DataFrame  # STEP_COLUMNS, one row per executed step
    tokens: pd.DataFrame  # tokens.parquet + worker, prompt_len, step
    requests: pd.DataFrame


def read_run_steps(run_dir: str | Path, padded: bool, fused: bool = False) -> RunSteps:
    """A run folder's executed steps (static batches and continuous steps alike), for a worker that pads its rows
    (`padded`) and runs a step's decodes and prompt chunks as one packed forward (`fused`)."""
    run = RunDir(run_dir)
    requests, batches, tokens = (_table(run, name) for name in ("requests", "batches", "tokens"))
    steps = _table(run, "steps") if run.table("steps").is_file() else pd.DataFrame(columns=list(NEEDED["steps"]))
    return executed_steps(requests, batches, tokens, steps, padded, fused)


def _table(run: RunDir, name: str) -> pd.DataFrame:
    """One table of the run, its NEEDED columns there and of their kinds; RunStepsError naming the file."""
    path = run.table(name)
    try:
        df = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a missing or bad file
        raise RunStepsError(f"{path}: cannot read it ({type(exc).__name__}: {exc})") from None
    missing = [c for c in NEEDED[name] if c not in df.columns]
    if missing:
        raise RunStepsError(f"{path}: lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    wrong = [f"{c} ({df[c].dtype}, not {kind})" for c, kind in NEEDED[name].items() if len(df)
             and not _of_kind(df[c], kind)]
    if wrong:
        raise RunStepsError(f"{path}: has columns of the wrong kind: {', '.join(wrong)}")
    return df


def _of_kind(column: pd.Series, kind: str) -> bool:
    if kind == "flag":
        return pd.api.types.is_bool_dtype(column)
    if kind == "number":
        return pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    return column.dropna().map(lambda v: isinstance(v, str)).all()


def executed_steps(requests: pd.DataFrame, batches: pd.DataFrame, tokens: pd.DataFrame, steps: pd.DataFrame,
                   padded: bool, fused: bool = False) -> RunSteps:
    """The tables of a run → its executed steps in the step model's terms (see the module's docstring)."""
    tokens = tokens.merge(batches[["batch_id", "worker"]], on="batch_id", how="left")
    tokens = tokens.merge(requests[["request_id", "prompt_len"]], on="request_id", how="left")
    tokens["step"] = -1
    stepping = set(steps["worker"]) if len(steps) else set()
    rows: list[list] = []
    for bid, group in tokens[~tokens["worker"].isin(stepping)].groupby("batch_id", sort=True):
        batch = batches[batches["batch_id"] == bid].iloc[0]
        rows += _static_batch(batch, group, tokens, len(rows))
    for _, own in steps.groupby("worker", sort=True):
        rows += _continuous_worker(own.sort_values("step"), tokens, padded, fused, len(rows))
    return RunSteps(pd.DataFrame(rows, columns=list(STEP_COLUMNS)), tokens, requests)


def _static_batch(batch: pd.Series, group: pd.DataFrame, tokens: pd.DataFrame, first: int) -> list[list]:
    """A lockstep batch's steps: step i ends when its rows' token i is stamped."""
    ends = group.groupby("token_index")["time"].max().sort_index()
    rows_n, width = int(batch["size"]), int(batch["max_prompt_len"])
    if batch["oom"] or list(ends.index) != list(range(len(ends))):
        return []  # a requeued or partly recorded batch: its steps cannot be told apart
    out, start = [], float(batch["scheduled_time"])
    for i, end in enumerate(ends.to_numpy()):
        if i == 0:
            out.append([batch["worker"], start, end, 0, 0.0, rows_n, rows_n * width, rows_n * width ** 2])
        else:
            out.append([batch["worker"], start, end, rows_n, rows_n * (width + i), 0, 0.0, 0.0])
        start = end
    tokens.loc[group.index, "step"] = first + group["token_index"].to_numpy()
    return out


def _continuous_worker(steps: pd.DataFrame, tokens: pd.DataFrame, padded: bool, fused: bool,
                       first: int) -> list[list]:
    """One continuous worker's steps, each with the rows its tokens say it ran; a padded worker's prompt chunks
    padded to the longest unless they ran packed beside decodes in one fused forward (worker.sim.ContinuousCore)."""
    mine = tokens[tokens["worker"] == steps["worker"].iloc[0]]
    ends = steps["end_time"].to_numpy()
    at = np.searchsorted(ends, mine["time"].to_numpy() - TIME_SLACK_S, side="left")
    at = np.minimum(at, len(ends) - 1)
    tokens.loc[mine.index, "step"] = first + at
    mine = mine.assign(at=at)
    joins = mine[mine["token_index"] == 0]
    group_width = joins.groupby("at")["prompt_len"].max()
    width_of = dict(zip(joins["request_id"], joins["at"].map(group_width)))
    out = []
    by_step = dict(tuple(mine.groupby("at")))
    for k, step in enumerate(steps.itertuples(index=False)):
        rows = by_step.get(k, mine.iloc[:0])
        decoded = rows[rows["token_index"] > 0]
        pads = pads_chunks(padded, fused, bool(len(decoded)))
        said = _said_chunks(step, pads)  # protocol ≥ 7
        out.append([step.worker, float(step.start_time), float(step.end_time),
                    *_decode_shape(decoded, padded, width_of),
                    *(said or _prefill_shape(rows[rows["token_index"] == 0], int(step.prefill_tokens), pads))])
    return out


def _decode_shape(decoded: pd.DataFrame, padded: bool, width_of: dict) -> tuple[int, float]:
    """(rows, context tokens) of a step's decodes."""
    n = len(decoded)
    if not n:
        return 0, 0.0
    index = decoded["token_index"].to_numpy()
    if padded:
        widths = decoded["request_id"].map(width_of).fillna(decoded["prompt_len"]).to_numpy()
        return n, float(n * np.max(widths + index))
    return n, float(np.sum(decoded["prompt_len"].to_numpy() + index))


def _said_chunks(step, pads: bool) -> tuple[int, float, float] | None:
    """(rows, tokens, token pairs) of a step's prompt chunks as its worker said them (protocol 7's prefill_rows,
    prefill_width, prefill_pairs; None in older runs): padded, every row as wide as the longest chunk, else packed,
    as the simulator times them (worker.sim.ContinuousCore._prefill_s)."""
    rows, width = int(getattr(step, "prefill_rows", 0)), int(getattr(step, "prefill_width", 0))
    if not (rows and width):
        return None
    if pads:
        return rows, float(rows * width), float(rows * width ** 2)
    return rows, float(step.prefill_tokens), float(getattr(step, "prefill_pairs", 0))


def _prefill_shape(joiners: pd.DataFrame, recorded_tokens: int, padded: bool) -> tuple[int, float, float]:
    """(rows, tokens, Σ prompt_len²) of a step's prefill from its joiners (a run before its worker said its
    chunks); a chunked prefill counts its recorded tokens."""
    lens = joiners["prompt_len"].to_numpy(dtype=float)
    whole = len(lens) and (lens.sum() <= recorded_tokens <= lens.sum() + len(lens)  # + a BOS per row
                           or recorded_tokens <= 0)  # a worker that records no prefill tokens (older vLLM runs)
    if not whole:
        if recorded_tokens <= 0:
            return 0, 0.0, 0.0
        rows = max(len(lens), 1)
        return rows, float(recorded_tokens), recorded_tokens ** 2 / rows
    if padded:
        return len(lens), float(len(lens) * lens.max()), float(len(lens) * lens.max() ** 2)
    return len(lens), float(lens.sum()), float(np.sum(lens ** 2))
