"""A real run replayed through a step model: its own recorded batches and steps, each step re-timed.

The run's decisions stay as recorded (which rows ran in which step, when each batch was launched and
each row dispatched); only the steps' durations come from the model, with a dispatch that answered a
step end (within REACTION_S of it) moving with that step's replayed end: docs/simulator.md gives the
rules and why. So replay ÷ real − 1 is the step model's error alone; a full simulation of the same
schedule adds the scheduling model's. With the model that played a `sim` run, a replay gives the
run's own times back. Pure: frames in, frames and a summary out.
"""
import bisect

import numpy as np
import pandas as pd

from batchlab.stats.metrics import summarize
from batchlab.worker.run_steps import RunSteps
from batchlab.worker.stepmodel import StepModel


REACTION_S = 0.02  # a dispatch this soon after one of its worker's step ends answered that step (measured ≤ 8 ms)


def predict_steps(model: StepModel, steps: pd.DataFrame) -> np.ndarray:
    """The model's duration of each executed step (or shape), as the simulator prices it."""
    out = np.empty(len(steps))
    for i, s in enumerate(steps.itertuples(index=False)):
        alone = not s.prefill_tokens
        decode = model.decode_step_s(s.decode_context, int(s.decode_rows), alone) if s.decode_rows else 0.0
        prefill = model.prefill_s(s.prefill_tokens, int(s.prefill_rows), s.prefill_pairs) if s.prefill_tokens else 0.0
        out[i] = model.fused_s(decode, prefill, int(s.decode_rows), int(s.prefill_tokens))
    return out


def ready_times(run: RunSteps) -> tuple[np.ndarray, np.ndarray]:
    """Each step's recorded dispatch of its rows (a static prefill's launch, a continuous step's latest
    joiner's scheduled_time; −inf for a step of rows already running) and when that latest joiner reached
    the scheduler (its recv_time)."""
    ready, arrived = np.full(len(run.steps), -np.inf), np.full(len(run.steps), -np.inf)
    firsts = run.tokens[(run.tokens["token_index"] == 0) & (run.tokens["step"] >= 0)]
    launched = firsts.merge(run.requests[["request_id", "scheduled_time", "recv_time"]], on="request_id", how="left")
    latest = launched.sort_values("scheduled_time").groupby("step").last()
    at = latest.index.to_numpy(dtype=int)
    ready[at], arrived[at] = latest["scheduled_time"].to_numpy(), latest["recv_time"].to_numpy()
    return ready, arrived


def replay_step_ends(run: RunSteps, model: StepModel) -> tuple[np.ndarray, np.ndarray]:
    """(replayed start, replayed end) of every executed step, worker by worker in recorded order."""
    steps = run.steps
    durations, (ready, arrived) = predict_steps(model, steps), ready_times(run)
    start, end = np.empty(len(steps)), np.empty(len(steps))
    for _, own in steps.groupby("worker", sort=False):
        prev_real, prev_new, real_ends, new_ends = -np.inf, -np.inf, [], []
        for k in own.sort_values(["start_s", "end_s"], kind="stable").index:
            bound_real = max(prev_real, ready[k])
            latency = max(steps.at[k, "start_s"] - bound_real, 0.0) if np.isfinite(bound_real) else 0.0
            bound_new = max(prev_new, _moved(ready[k], arrived[k], real_ends, new_ends))
            start[k] = (bound_new if np.isfinite(bound_new) else steps.at[k, "start_s"]) + latency
            end[k] = start[k] + durations[k]
            prev_real, prev_new = steps.at[k, "end_s"], end[k]
            real_ends.append(prev_real)
            new_ends.append(prev_new)
    return start, end


def _moved(ready_s: float, arrived_s: float, real_ends: list[float], new_ends: list[float]) -> float:
    """A step's dispatch in the replayed timeline. Rows that were already waiting when one of the worker's
    steps ended, dispatched within REACTION_S of that end, were the scheduler's answer to it (the step
    freed their room): the dispatch moves with that step's replayed end. Any other dispatch (an arrival,
    a timer) stays where it was."""
    j = bisect.bisect_right(real_ends, ready_s) - 1
    if j < 0 or not np.isfinite(ready_s) or not arrived_s < real_ends[j] or ready_s - real_ends[j] > REACTION_S:
        return ready_s
    return new_ends[j] + (ready_s - real_ends[j])


def replay(run: RunSteps, model: StepModel, settings: dict | None = None) -> dict:
    """The run's summary (summary.json's figures) as the replay times it."""
    _, ends = replay_step_ends(run, model)
    real_ends = run.steps["end_s"].to_numpy()
    tokens = run.tokens[run.tokens["step"] >= 0].copy()
    at = tokens["step"].to_numpy(dtype=int)
    tokens["time"] = tokens["time"].to_numpy() + ends[at] - real_ends[at]  # a token stamped mid-step keeps its lead
    per_request = tokens.groupby("request_id")["time"]
    requests = run.requests.copy()
    ids = requests["request_id"]
    first = tokens[tokens["token_index"] == 0].groupby("request_id")["time"].min()
    requests["first_token_time"] = ids.map(first).where(requests["first_token_time"].notna())
    requests["completion_time"] = ids.map(per_request.max()).where(requests["completion_time"].notna())
    return summarize(requests, tokens[["request_id", "token_index", "token_id", "time", "batch_id"]],
                     settings or {})
