"""Calibration from real runs: the step model fitted to the steps a live worker executed (worker.run_steps).

Every cost the worker paid while serving (other processes on its cores, the LM head's plan, dispatch)
is in those steps' durations, so it is in the fit; the in-process grid (lab.calibrate_measure) stays
for a clean machine. Steps are grouped into shapes (decode rows, context per row, prefill rows, tokens
per row, each per half octave); a shape's time and terms are its steps' means, so the fit keeps the
steps' total time. One non-negative least squares on relative error fits every term at once (a mixed
step pays both parts, less what a fused forward shares: worker.stepmodel.StepModel.fused_s); a shape
weighs √(its steps) (`weigh="steps"`: a one-off step counts less than a common one) or √(its steps × its
time ÷ the mean step's) (`weigh="time"`: its share of the run's time, so many short shapes do not outvote
the long ones that carry the time). Each shape's error is also given
held out: predicted by a fit without it. Pure: frames in, a model and its table out.
"""
import math

import numpy as np
import pandas as pd

from batchlab.worker.calibrate import Constants, model_from_terms, nnls
from batchlab.worker.stepmodel import StepModel

COMPUTE = ("overhead_s", "decode_s_per_row", "decode_s_per_context_token", "prefill_overhead_s",
           "prefill_s_per_token", "prefill_s_per_row", "prefill_s_per_token_pair")
MEMORY = ("overhead_s", "inverse_bandwidth", "prefill_overhead_s", "prefill_s_per_token")
SHAPE_KEYS = ("kind", "decode_rows", "context_bin", "prefill_rows", "prompt_bin")
WEIGHS = ("steps", "time")
MEANS = ("decode_context", "prefill_tokens", "prefill_pairs", "seconds")


def _bin(values: pd.Series) -> pd.Series:
    return np.round(2 * np.log2(values.clip(lower=1.0))).astype(int)


def shapes(steps: pd.DataFrame) -> pd.DataFrame:
    """Executed steps (worker.run_steps.STEP_COLUMNS) grouped into shapes: their means and step count."""
    s = steps.assign(seconds=steps["end_s"] - steps["start_s"])
    s = s[(s["seconds"] > 0) & ((s["decode_rows"] > 0) | (s["prefill_tokens"] > 0))]
    kind = np.where(s["decode_rows"] == 0, "prefill", np.where(s["prefill_tokens"] == 0, "decode", "mixed"))
    per_row_context = _bin(s["decode_context"] / s["decode_rows"].clip(lower=1))
    per_row_prompt = _bin(s["prefill_tokens"] / s["prefill_rows"].clip(lower=1))
    s = s.assign(kind=kind, context_bin=np.where(s["decode_rows"] > 0, per_row_context, 0),
                 prompt_bin=np.where(s["prefill_rows"] > 0, per_row_prompt, 0))
    grouped = s.groupby(list(SHAPE_KEYS), sort=True)
    return grouped[list(MEANS)].mean().join(grouped.size().rename("steps")).reset_index()


def features(sh: pd.DataFrame, form: str, c: Constants, shared: str = "overhead_s") -> np.ndarray:
    """[shapes × terms]: each term's multiplier; `shared`: the overhead a fused mixed step pays once."""
    dec, pre = (sh["decode_rows"] > 0).to_numpy(float), (sh["prefill_tokens"] > 0).to_numpy(float)
    both = dec * pre if c.fused else np.zeros(len(sh))
    if form == "memory":
        streamed = dec * (c.weights_bytes + c.kv_bytes_per_token * sh["decode_context"].to_numpy()) \
            + pre * c.weights_bytes - both * c.weights_bytes
        cols = {"overhead_s": dec, "inverse_bandwidth": streamed, "prefill_overhead_s": pre,
                "prefill_s_per_token": sh["prefill_tokens"].to_numpy()}
    else:
        cols = {"overhead_s": dec, "decode_s_per_row": sh["decode_rows"].to_numpy(float),
                "decode_s_per_context_token": sh["decode_context"].to_numpy(), "prefill_overhead_s": pre,
                "prefill_s_per_token": sh["prefill_tokens"].to_numpy(),
                "prefill_s_per_row": sh["prefill_rows"].to_numpy(float),
                "prefill_s_per_token_pair": sh["prefill_pairs"].to_numpy()}
    cols[shared] = cols[shared] - both
    return np.column_stack([cols[n] for n in (MEMORY if form == "memory" else COMPUTE)])


def _solve(sh: pd.DataFrame, form: str, c: Constants, weigh: str = "steps") -> dict[str, float]:
    """The terms; for a fused model, the fit whose shared overhead is the smaller one (as fused_s pays)."""
    y, n = sh["seconds"].to_numpy(), sh["steps"].to_numpy()
    w = np.sqrt(n * y / np.average(y, weights=n)) if weigh == "time" else np.sqrt(n)
    names = MEMORY if form == "memory" else COMPUTE
    fits = []  # (inconsistent, residual, terms)
    for shared in (("overhead_s", "prefill_overhead_s") if c.fused else ("overhead_s",)):
        a = features(sh, form, c, shared)
        terms = dict(zip(names, map(float, nnls(a * (w / y)[:, None], w))))
        residual = float(np.sum(((a @ np.array(list(terms.values()))) / y - 1) ** 2 * w ** 2))
        other = "prefill_overhead_s" if shared == "overhead_s" else "overhead_s"
        fits.append((c.fused and terms[shared] > terms[other] + 1e-12, residual, terms))
    return min(fits, key=lambda f: f[:2])[2]


def predict_steps(model: StepModel, steps: pd.DataFrame) -> np.ndarray:
    """The model's duration of each executed step (or shape), as the simulator prices it."""
    out = np.empty(len(steps))
    for i, s in enumerate(steps.itertuples(index=False)):
        decode = model.decode_step_s(s.decode_context, int(s.decode_rows)) if s.decode_rows else 0.0
        prefill = model.prefill_s(s.prefill_tokens, int(s.prefill_rows), s.prefill_pairs) if s.prefill_tokens else 0.0
        out[i] = model.fused_s(decode, prefill)
    return out


def fit_runs(steps: pd.DataFrame, name: str, form: str, c: Constants,
             weigh: str = "steps") -> tuple[StepModel, pd.DataFrame]:
    """The fitted model and its per-shape table (measured, model, fit error, held-out error)."""
    if weigh not in WEIGHS:
        raise ValueError(f"--weigh must be one of {', '.join(WEIGHS)}, not {weigh!r}")
    sh = shapes(steps)
    if len(sh) < 2:
        raise ValueError(f"{len(sh)} step shape(s) in these runs: too few to fit a step model")
    model = model_from_terms(_solve(sh, form, c, weigh), name, form, c)
    table = sh.assign(model_s=predict_steps(model, sh))
    table["fit_error"] = table["model_s"] / table["seconds"] - 1
    table["held_out_error"] = held_out(sh, name, form, c, weigh)
    return model, table


def held_out(sh: pd.DataFrame, name: str, form: str, c: Constants, weigh: str = "steps") -> np.ndarray:
    """Each shape predicted by a fit to the others (NaN with fewer than 3 shapes)."""
    if len(sh) < 3:
        return np.full(len(sh), np.nan)
    out = np.empty(len(sh))
    for i in range(len(sh)):
        rest = sh.drop(sh.index[i])
        model = model_from_terms(_solve(rest, form, c, weigh), name, form, c)
        out[i] = predict_steps(model, sh.iloc[[i]])[0] / sh["seconds"].iloc[i] - 1
    return out


def total_time_error(model: StepModel, steps: pd.DataFrame) -> float:
    """Σ predicted ÷ Σ measured − 1 over every executed step (what throughput feels)."""
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    return float(predict_steps(model, steps).sum() / measured.sum() - 1) if measured.sum() > 0 else math.nan
