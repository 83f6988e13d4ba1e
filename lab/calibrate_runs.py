"""`batchlab calibrate --from RUN_DIR...`: the step model fitted to the steps live workers executed in runs
(worker.run_steps).

A RUN_DIR is a run folder (summary.json) or a folder holding some (a sweep: every point under it).
The runs must share one backend kind (hf static, hf-loop, vllm or sim: lab.simulate's kinds), chosen
with --kind when the folders hold several; their constants (weights, KV bytes per token, padding,
fusion, the per-step token budget) come from what the worker reported in the run's settings.

Every cost the worker paid while serving (other processes on its cores, the LM head's plan, dispatch)
is in those steps' durations, so it is in the fit; the in-process grid (lab.calibrate) stays
for a clean machine. Steps are grouped into shapes (decode rows, context per row, prefill rows, tokens
per row, each per half octave); a shape's time and terms are its steps' means, so the fit keeps the
steps' total time. One non-negative least squares on relative error fits every term at once (a mixed
step pays both parts, less what a fused forward shares: worker.stepmodel.StepModel.fused_s); a shape
weighs √(its steps) (`weigh="steps"`: a one-off step counts less than a common one) or √(its steps × its
time ÷ the mean step's) (`weigh="time"`: its share of the run's time, so many short shapes do not outvote
the long ones that carry the time). Each shape's error is also given
held out: predicted by a fit without it. Where the terms leave a row count's decode steps alone (no prompt in
them) long or short, that row count gets its own factor, their total time over the terms' (row_factors: a shape
no linear term draws, vLLM's on this CPU). The fit is pure: frames in, a model and its table out.
"""
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.collector.layout import CAPACITY_DIR, PROBE_DIR, SATURATED_DIR, WORKERS_DIR
from batchlab.collector.summary import read_summary
from batchlab.protocol.modes import BatchingMode
from batchlab.lab.calibrate import Constants, model_from_terms, nnls
from batchlab.lab.simulate import CALIBRATED_KIND
from batchlab.protocol.run_dir import SUMMARY_FILE, RunDir
from batchlab.protocol.errors import CalibrateError, term
from batchlab.protocol.setting_groups import said
from batchlab.protocol.study_settings import CalibrateSettings
from batchlab.simulator.replay import predict_steps
from batchlab.worker.run_steps import RunStepsError, read_run_steps
from batchlab.worker.stepmodel import StepModel, save_preset

COMPUTE = ("overhead_s", "decode_s_per_row", "decode_s_per_context_token", "prefill_overhead_s",
           "prefill_s_per_token", "prefill_s_per_row", "prefill_s_per_token_pair")
MEMORY = ("overhead_s", "inverse_bandwidth", "prefill_overhead_s", "prefill_s_per_token")
SHAPE_KEYS = ("kind", "decode_rows", "context_bin", "prefill_rows", "prompt_bin")
WEIGHS = ("steps", "time")
MEANS = ("decode_context", "prefill_tokens", "prefill_pairs", "seconds")
NOT_POINTS = {PROBE_DIR, SATURATED_DIR, CAPACITY_DIR, WORKERS_DIR}  # bursts, saturated runs, probes, workers' own
KIND_ORIGIN = {kind: key for key, kind in CALIBRATED_KIND.items()}  # hf-loop -> (hf, continuous)
ROW_FACTOR_STEPS = 5  # a row count's decode steps alone that its own factor needs (row_factors)


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


Ties = dict[str, float]  # terms fitted as one, in these proportions (a term: its weight)


def tie_matrix(names: tuple[str, ...], ties: list[Ties]) -> np.ndarray:
    """[terms × free coefficients]: each tie's terms share one coefficient, in the tie's proportions; every
    other term is its own."""
    tied = {t for tie in ties for t in tie}
    free = [n for n in names if n not in tied]
    m = np.zeros((len(names), len(free) + len(ties)))
    for j, n in enumerate(free):
        m[names.index(n), j] = 1.0
    for k, tie in enumerate(ties):
        for t, weight in tie.items():
            m[names.index(t), len(free) + k] = weight
    return m


def _solve(sh: pd.DataFrame, form: str, c: Constants, weigh: str = "steps",
           ties: list[Ties] | None = None) -> dict[str, float]:
    """The terms; for a fused model, one fit with each overhead as the one a mixed step shares, and the one whose
    error is least as fused_s prices it (sharing the smaller overhead: a fit that shared the larger prices its
    mixed steps with the larger one, which it never fitted: make run's busy vLLM twin read its mixed steps 5% off
    as fitted and 40% as priced). `ties`: groups of terms the steps cannot tell apart, fitted as one in given
    proportions (fit_twin's)."""
    y, n = sh["seconds"].to_numpy(), sh["steps"].to_numpy()
    w = np.sqrt(n * y / np.average(y, weights=n)) if weigh == "time" else np.sqrt(n)
    names = MEMORY if form == "memory" else COMPUTE
    tie = tie_matrix(names, ties or [])
    fits = []  # (residual as priced, terms)
    for shared in (("overhead_s", "prefill_overhead_s") if c.fused else ("overhead_s",)):
        a = features(sh, form, c, shared)
        terms = dict(zip(names, map(float, tie @ nnls((a @ tie) * (w / y)[:, None], w))))
        priced = features(sh, form, c, priced_shared(terms)) if c.fused else a
        fits.append((float(np.sum(((priced @ np.array(list(terms.values()))) / y - 1) ** 2 * w ** 2)), terms))
    return min(fits, key=lambda f: f[0])[1]


def priced_shared(terms: dict[str, float]) -> str:
    """The overhead a fused mixed step pays once as fused_s prices it: the smaller of the two (it pays the
    larger)."""
    return "overhead_s" if terms["overhead_s"] <= terms["prefill_overhead_s"] else "prefill_overhead_s"


def fit_runs(steps: pd.DataFrame, name: str, form: str, c: Constants,
             weigh: str = "steps", ties: list[Ties] | None = None) -> tuple[StepModel, pd.DataFrame]:
    """The fitted model and its per-shape table (measured, model, fit error, held-out error); `ties`: see
    _solve."""
    if weigh not in WEIGHS:
        raise CalibrateError(f"{said('weigh', schema=CalibrateSettings)} must be one of {', '.join(WEIGHS)}, not "
                             f"{weigh!r}")
    sh = shapes(steps)
    if len(sh) < 2:
        raise CalibrateError(f"{len(sh)} step shape(s) in these runs: too few to fit a step model")
    model = with_row_factors(model_from_terms(_solve(sh, form, c, weigh, ties), name, form, c), sh)
    table = sh.assign(model_s=predict_steps(model, sh))
    table["fit_error"] = table["model_s"] / table["seconds"] - 1
    table["held_out_error"] = held_out(sh, name, form, c, weigh, ties)
    return model, table


def row_factors(sh: pd.DataFrame, model: StepModel) -> tuple[float, ...]:
    """Each row count's decode steps alone (no prompt in them): their total time ÷ the terms' time for them (to
    0.1%), for 1 to the most rows, where the runs held ROW_FACTOR_STEPS of them (1 elsewhere: the terms alone).
    A shape the linear terms cannot draw: vLLM on the 2-core CPU took 13 ms a step for 1 row, 15 ms for 2, 11 ms
    for 4 and 15 ms for 8 in make run's saturated runs (their drains) as in its grid's, where the twin fitted to
    the 8-row steps that carry the time ran 30% fast on the grid's 1 and 2."""
    decode = sh[sh["kind"] == "decode"]
    if decode.empty:
        return ()
    terms = [model.decode_step_s(context, int(rows), alone=False) * steps
             for context, rows, steps in zip(decode["decode_context"], decode["decode_rows"], decode["steps"])]
    by_rows = decode.assign(time=decode["seconds"] * decode["steps"], terms=terms).groupby("decode_rows")
    sums = by_rows[["steps", "time", "terms"]].sum()
    sums = sums[(sums["steps"] >= ROW_FACTOR_STEPS) & (sums["terms"] > 0)]
    if sums.empty:
        return ()
    factors = {int(r): round(float(f), 3) for r, f in (sums["time"] / sums["terms"]).items()}
    table = [factors.get(r, 1.0) for r in range(1, max(factors) + 1)]
    while table and table[-1] == 1.0:  # past the table is 1 already
        table.pop()
    return tuple(table)


def with_row_factors(model: StepModel, sh: pd.DataFrame) -> StepModel:
    """The model with its row counts' factors fitted to the shapes' decode steps (row_factors)."""
    return replace(model, decode_rows_factor=row_factors(sh, model))


def held_out(sh: pd.DataFrame, name: str, form: str, c: Constants, weigh: str = "steps",
             ties: list[Ties] | None = None) -> np.ndarray:
    """Each shape predicted by a fit to the others (NaN with fewer than 3 shapes)."""
    if len(sh) < 3:
        return np.full(len(sh), np.nan)
    out = np.empty(len(sh))
    for i in range(len(sh)):
        rest = sh.drop(sh.index[i])
        model = with_row_factors(model_from_terms(_solve(rest, form, c, weigh, ties), name, form, c), rest)
        out[i] = predict_steps(model, sh.iloc[[i]])[0] / sh["seconds"].iloc[i] - 1
    return out


def total_time_error(model: StepModel, steps: pd.DataFrame) -> float:
    """Σ predicted ÷ Σ measured − 1 over every executed step (what throughput feels)."""
    measured = (steps["end_s"] - steps["start_s"]).to_numpy()
    return float(predict_steps(model, steps).sum() / measured.sum() - 1) if measured.sum() > 0 else math.nan


def run_folders(dirs: list[str]) -> list[Path]:
    """Every run folder at or under each of `dirs`, in order, but a sweep's probes and searches (NOT_POINTS)."""
    found = []
    for d in map(Path, dirs):
        if not d.is_dir():
            raise CalibrateError(f"{term('--from', 'runs')} {d}: no such folder")
        runs = [d] if RunDir(d).summary.is_file() else sorted(p.parent for p in d.rglob(SUMMARY_FILE))
        runs = [r for r in runs if not set(r.relative_to(d).parts) & NOT_POINTS]
        if not runs:
            raise CalibrateError(f"{term('--from', 'runs')} {d}: no run folder (summary.json) in it")
        found += runs
    return found


def run_facts(run: Path) -> dict:
    """A run's backend kind and the fit's constants, from its summary's settings and its worker's hello;
    CalibrateError naming summary.json when they are not what a run writes."""
    try:
        return _facts(run)
    except (TypeError, ValueError, AttributeError) as exc:
        raise CalibrateError(f"{RunDir(run).summary}: its settings' worker facts cannot be read "
                             f"({type(exc).__name__}: {exc})") from None


def _facts(run: Path) -> dict:
    settings = read_summary(run).settings
    workers = settings.get("workers") or {}
    hello = next(iter(workers.values()), {}) if isinstance(workers, dict) else {}
    if not isinstance(hello, dict):
        raise TypeError(f"settings.workers' entry is {type(hello).__name__}, not an object")
    backend, mode = hello.get("backend") or settings.get("backend"), hello.get("mode")
    mode = mode or (BatchingMode.CONTINUOUS if RunDir(run).table("steps").is_file() else BatchingMode.STATIC).value
    kind = CALIBRATED_KIND.get((backend, mode), backend)
    preset = hello.get("preset") if isinstance(hello.get("preset"), dict) else {}
    n_params = hello.get("n_params") or 0
    weights = preset.get("weights_bytes") or float(n_params * (4 if hello.get("dtype", "float32") == "float32" else 2))
    padded = preset["padded"] if "padded" in preset else backend == "hf"
    fused = preset["fused"] if "fused" in preset else kind in ("hf-loop", "vllm")  # one forward a step
    memory = preset.get("memory_bytes") or (hello.get("kv_budget_bytes", 0) + weights) / 0.9
    device = str(hello.get("device", settings.get("device", "")))
    return {"kind": kind, "backend": backend, "mode": mode, "device": device, "model": settings.get("model"),
            "constants": Constants(float(weights), int(hello.get("kv_bytes_per_token") or 0), float(memory),
                                   bool(padded), bool(fused), _step_tokens(hello, preset, kind))}


def _step_tokens(hello: dict, preset: dict, kind: str) -> int:
    """The worker's per-step token budget: the HF loop's (its hello says it), a sim worker's preset's; 0 for
    static batches and for vLLM (its chunked-prefill default leaves this project's prompts whole)."""
    if kind == "hf-loop":
        return int(hello.get("max_num_batched_tokens") or 0)
    return int(preset.get("step_tokens") or 0)


def chosen_runs(dirs: list[str], kind: str) -> tuple[list[Path], dict]:
    """The runs of one kind and that kind's facts; CalibrateError naming the kinds when they are mixed."""
    runs = run_folders(dirs)
    facts = {run: run_facts(run) for run in runs}
    kinds = sorted({f["kind"] for f in facts.values()})
    if kind:
        runs = [r for r in runs if facts[r]["kind"] == kind]
        if not runs:
            raise CalibrateError(f"{said('kind', schema=CalibrateSettings)} {kind}: none of these runs ran on it "
                                 f"(they ran on {', '.join(kinds)})")
    elif len(kinds) > 1:
        raise CalibrateError(f"these runs ran on {', '.join(kinds)}: a step model is one backend's; "
                             f"choose one with {said('kind', schema=CalibrateSettings)} ({' | '.join(kinds)})")
    return runs, facts[runs[0]]


def calibrate_from(dirs: list[str], *, kind: str, form: str, out: str, name: str, weigh: str = "steps",
                   say: Callable[[str], None] | None = None, show: Callable | None = None) -> dict:
    """Read the runs' executed steps, fit, write the preset; the record. `say`: a line before fitting and one
    after writing; `show(table, record)`: the per-shape table (a DataFrame) and the record, before the preset
    is written."""
    started = time.monotonic()
    runs, facts = chosen_runs(dirs, kind)
    say = say or (lambda line: None)
    model, table, record = fit_folders(runs, facts, form, name, weigh, started, say)
    if show is not None:
        show(table, record)
    save_preset(model, out, record)
    say(f"wrote {out} (use {said('preset')} {facts['kind']}={out})")
    return record


def fit_folders(runs: list[Path], facts: dict, form: str, name: str, weigh: str = "steps",
                started: float | None = None, say: Callable[[str], None] | None = None,
                tie_rows: StepModel | None = None) -> tuple[StepModel, pd.DataFrame, dict]:
    """The step model fitted to these run folders' executed steps (one backend kind, `facts`: run_facts of
    one of them), its per-shape table and the record a preset keeps; CalibrateError when they cannot give it.
    `tie_rows` (a prior model of the same kind, compute form): where every decode (or prefill) step held the same
    number of rows, its fixed cost and its cost per row cannot be told apart; they are fitted as one, in the
    prior's proportions (the record says so under `tied`)."""
    started = time.monotonic() if started is None else started
    form = form if form != "auto" else ("memory" if "cuda" in facts["device"] else "compute")
    c = facts["constants"]
    steps = pd.concat([_run_steps(r, c.padded, c.fused) for r in runs], ignore_index=True)
    if say is not None:
        say(f"calibrating {facts['kind']} from {len(runs)} run(s): {len(steps)} executed steps, form {form}")
    ties = row_ties(steps, tie_rows) if tie_rows is not None and form == "compute" else []
    model, table = fit_runs(steps, name, form, facts["constants"], weigh, ties)
    record = {**_record(facts, runs, table, total_time_error(model, steps), started), "weigh": weigh,
              **({"tied": {"prior": tie_rows.name, "terms": ties}} if ties else {})}
    return model, table, record


def row_ties(steps: pd.DataFrame, prior: StepModel) -> list[Ties]:
    """The tied terms where the steps hold one row count only: (overhead_s, decode_s_per_row) when every decode
    step held the same rows, (prefill_overhead_s, prefill_s_per_row) when every prefill did; in `prior`'s
    proportions."""
    ties = []
    decode, prefill = steps["decode_rows"][steps["decode_rows"] > 0], steps["prefill_rows"][steps["prefill_rows"] > 0]
    if decode.nunique() == 1:
        ties.append({"overhead_s": prior.overhead_s, "decode_s_per_row": prior.decode_s_per_row})
    if prefill.nunique() == 1:
        fixed = prior.overhead_s if prior.prefill_overhead_s is None else prior.prefill_overhead_s
        ties.append({"prefill_overhead_s": fixed, "prefill_s_per_row": prior.prefill_s_per_row})
    return [t for t in ties if sum(t.values()) > 0]


def _run_steps(run: Path, padded: bool, fused: bool) -> pd.DataFrame:
    """One run's executed steps; CalibrateError naming the table that cannot give them."""
    try:
        return read_run_steps(run, padded, fused).steps
    except RunStepsError as exc:
        raise CalibrateError(str(exc)) from None


def _summary(table, key: str) -> dict:
    out = {}
    for kind, rows in table.groupby("kind"):
        values = rows[key].abs().dropna()
        if len(values):
            out[str(kind)] = {"mean_abs": round(float(values.mean()), 4), "worst_abs": round(float(values.max()), 4)}
    return out


def _record(facts: dict, runs: list[Path], table, total_error: float, started: float) -> dict:
    backend, mode = KIND_ORIGIN.get(facts["kind"], (facts["backend"], facts["mode"]))
    shapes = [{k: (None if isinstance(v, float) and math.isnan(v) else (round(v, 6) if isinstance(v, float) else v))
               for k, v in row.items()} for row in table.to_dict("records")]
    return {"backend": backend, "mode": mode, "model": facts["model"], "device": facts["device"],
            "from_runs": [str(r) for r in runs], "measured": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_1m": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started, 1),
            "steps": int(table["steps"].sum()), "total_time_error": round(total_error, 4),
            "fit_error": _summary(table, "fit_error"), "held_out_error": _summary(table, "held_out_error"),
            "shapes": shapes}
