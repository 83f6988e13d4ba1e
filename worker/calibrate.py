"""Calibration's pure half: measured step times → a fitted StepModel, with its error per shape.

A `Sample` is one step kind (prefill or decode) at one grid shape, its time the median of rounds that
were repeated until their spread settled (`settle`). `fit_model` solves non-negative least squares on
relative error (every shape counts alike, 1 ms or 1 s) for the named terms of the chosen form
(worker.stepmodel): compute-bound (a CPU) or memory-bound (a GPU: the bandwidth form). No I/O, no clock.
"""
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchlab.worker.stepmodel import StepModel

FORMS = ("compute", "memory")
SETTLE_TOLERANCE = 0.05  # rounds settle when their median absolute deviation is ≤ 5% of their median


@dataclass(slots=True)
class Sample:
    """One step kind at one grid shape (seconds, the median of its rounds)."""

    kind: str  # "prefill" | "decode"
    rows: int
    prompt_len: int  # tokens per row (as the schedule counts them: no BOS)
    tokens: float  # prefill: tokens in the forward; decode: cached tokens the step attends over (all rows)
    seconds: float
    spread: float = 0.0  # median absolute deviation of the rounds ÷ their median
    rounds: int = 1
    settled: bool = True

    @property
    def token_pairs(self) -> float:
        """Σ prompt_len² over the rows (prefill attention)."""
        return self.rows * self.prompt_len ** 2


@dataclass(slots=True)
class Settled:
    """A repeated measurement: its median, spread, rounds taken and whether the spread settled."""

    value: float
    spread: float
    rounds: int
    settled: bool


@dataclass(slots=True)
class Constants:
    """What the fit does not fit: the model's bytes and how its worker lays out rows."""

    weights_bytes: float = 0.0
    kv_bytes_per_token: int = 0
    memory_bytes: float = 0.0
    padded: bool = False
    fused: bool = False
    step_tokens: int = 0  # the worker's per-step token budget (0: none)


def spread(values: list[float]) -> float:
    """Median absolute deviation ÷ median (0 for one value)."""
    med = statistics.median(values)
    return statistics.median(abs(v - med) for v in values) / med if med > 0 else 0.0


def settle(measure: Callable[[], dict[str, float]], min_rounds: int = 3, max_rounds: int = 8,
           tolerance: float = SETTLE_TOLERANCE) -> dict[str, Settled]:
    """Call `measure` (one round: {kind: seconds}) until every kind's spread is ≤ tolerance after at
    least `min_rounds` rounds, or `max_rounds` were taken (then `settled` is False: too noisy)."""
    rounds: dict[str, list[float]] = {}
    for n in range(1, max_rounds + 1):
        for kind, seconds in measure().items():
            rounds.setdefault(kind, []).append(seconds)
        if n >= min_rounds and all(spread(v) <= tolerance for v in rounds.values()):
            break
    return {kind: Settled(statistics.median(v), spread(v), len(v), spread(v) <= tolerance)
            for kind, v in rounds.items()}


def _features(kind: str, form: str, s: Sample, weights_bytes: float, kv_bytes_per_token: int) -> dict[str, float]:
    """The named terms' multipliers for one sample (a term's coefficient × this = its seconds)."""
    if kind == "decode" and form == "compute":
        return {"overhead_s": 1.0, "decode_s_per_row": s.rows, "decode_s_per_context_token": s.tokens}
    if kind == "decode":
        return {"overhead_s": 1.0, "inverse_bandwidth": weights_bytes + kv_bytes_per_token * s.tokens}
    if form == "compute":
        return {"prefill_overhead_s": 1.0, "prefill_s_per_token": s.tokens, "prefill_s_per_row": s.rows,
                "prefill_s_per_token_pair": s.token_pairs}
    return {"prefill_overhead_s": 1.0, "prefill_s_per_token": s.tokens}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x − b| with x ≥ 0, exactly, by trying every subset of columns (a few terms only)."""
    best, best_x = np.inf, np.zeros(a.shape[1])
    for k in range(1, a.shape[1] + 1):
        for cols in itertools.combinations(range(a.shape[1]), k):
            x_sub = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
            if np.any(x_sub < 0):
                continue
            residual = float(np.sum((a[:, cols] @ x_sub - b) ** 2))
            if residual < best - 1e-18:
                best, best_x = residual, np.zeros(a.shape[1])
                best_x[list(cols)] = x_sub
    return best_x


def fit_terms(samples: list[Sample], kind: str, form: str, weights_bytes: float = 0.0,
              kv_bytes_per_token: int = 0, offset_s: float = 0.0) -> dict[str, float]:
    """The named terms of one step kind, fitted on relative error; `offset_s` is a known fixed part."""
    chosen = [s for s in samples if s.kind == kind]
    if not chosen:
        raise ValueError(f"no {kind} samples to fit")
    rows = [_features(kind, form, s, weights_bytes, kv_bytes_per_token) for s in chosen]
    names = list(rows[0])
    y = np.array([s.seconds for s in chosen])
    a = np.array([[r[n] for n in names] for r in rows]) / y[:, None]  # relative: divide each row by y
    x = nnls(a, (y - offset_s) / y)
    return dict(zip(names, map(float, x)))


def fit_model(samples: list[Sample], name: str, *, form: str = "compute", weights_bytes: float = 0.0,
              kv_bytes_per_token: int = 0, memory_bytes: float = 0.0, padded: bool = False,
              fused: bool = False, step_tokens: int = 0) -> StepModel:
    """A StepModel of `form` fitted to the samples (decode terms from decode samples, prefill from prefill);
    `padded`, `fused` and `step_tokens` describe the worker measured (see StepModel)."""
    if form not in FORMS:
        raise ValueError(f"unknown step-model form {form!r} (one of {', '.join(FORMS)})")
    decode = fit_terms(samples, "decode", form, weights_bytes, kv_bytes_per_token)
    inverse = decode.get("inverse_bandwidth", 0.0)  # memory form: the weights' stream is a known part of a prefill
    prefill = fit_terms(samples, "prefill", form, offset_s=weights_bytes * inverse)
    c = Constants(weights_bytes, kv_bytes_per_token, memory_bytes, padded, fused, step_tokens)
    return model_from_terms({**decode, **prefill}, name, form, c)


def model_from_terms(terms: dict[str, float], name: str, form: str, c: Constants) -> StepModel:
    """The StepModel of fitted terms."""
    if form == "memory":
        inverse = terms["inverse_bandwidth"]
        return StepModel(name, c.weights_bytes, c.kv_bytes_per_token, 1 / inverse if inverse > 0 else 0.0,
                         terms["prefill_s_per_token"], terms["overhead_s"], c.memory_bytes,
                         prefill_overhead_s=terms["prefill_overhead_s"], padded=c.padded, fused=c.fused,
                         step_tokens=c.step_tokens)
    return StepModel(name, c.weights_bytes, c.kv_bytes_per_token, 0.0, terms["prefill_s_per_token"],
                     terms["overhead_s"], c.memory_bytes, terms["decode_s_per_row"],
                     terms["decode_s_per_context_token"], terms["prefill_s_per_row"],
                     terms["prefill_s_per_token_pair"], terms["prefill_overhead_s"], c.padded, c.fused,
                     c.step_tokens)


def predict(model: StepModel, s: Sample) -> float:
    """The model's time for a sample's step."""
    if s.kind == "decode":
        return model.decode_step_s(round(s.tokens), s.rows)
    return model.prefill_s(round(s.tokens), s.rows, s.token_pairs)


def errors(model: StepModel, samples: list[Sample]) -> list[float]:
    """Relative error (model ÷ measured − 1) per sample."""
    return [predict(model, s) / s.seconds - 1 for s in samples]


def held_out_errors(samples: list[Sample], name: str, **fit_options) -> list[float]:
    """Each shape predicted by a model fitted without it (both its samples left out): leave-one-out."""
    shapes = sorted({(s.rows, s.prompt_len) for s in samples})
    out = []
    for s in samples:
        rest = [o for o in samples if (o.rows, o.prompt_len) != (s.rows, s.prompt_len)]
        if len(shapes) < 3 or not any(o.kind == s.kind for o in rest):
            out.append(float("nan"))
            continue
        out.append(predict(fit_model(rest, name, **fit_options), s) / s.seconds - 1)
    return out
