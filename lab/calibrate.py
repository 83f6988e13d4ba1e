"""`batchlab calibrate` on a grid: a warm backend's step times measured on this machine, and the StepModel
fitted to them, with its error per shape (lab.calibrate_runs fits the steps of live runs instead).

Measuring: real step times over a grid of batch sizes and prompt lengths, each shape repeated until its
spread settles (`settle`). Static backends (HF generate()) run a lockstep batch: the prefill is timed from
the run_batch call to the first token (what the simulator counts from a batch's launch), decode steps as
the gaps between step ends. Continuous backends (the HF loop, vLLM) get every row admitted at once and are
stepped; the prefill is the steps until every row has its first token. Decode steps skip the first one
after the prefill (its cache still grows) and report their median.

Fitting (pure: no I/O, no clock): `fit_model` solves, over the `Sample`s (a step kind at a shape), non-negative
least squares on relative error (every shape counts alike, 1 ms or 1 s) for the named terms of the chosen
form (worker.stepmodel): compute-bound (a CPU) or memory-bound (a GPU: the bandwidth form).
"""
import itertools
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from batchlab.protocol.clock import now
from batchlab.protocol.errors import CalibrateError
from batchlab.protocol.modes import BatchingMode
from batchlab.worker.backend import BackendRequest, StepOutput
from batchlab.worker.stepmodel import StepModel, save_preset

FORMS = ("compute", "memory")
SETTLE_TOLERANCE = 0.05  # rounds settle when their median absolute deviation is ≤ 5% of their median
SKIP_DECODE_STEPS = 1


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
        raise CalibrateError(f"no {kind} samples to fit")
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
        raise CalibrateError(f"unknown step-model form {form!r} (one of {', '.join(FORMS)})")
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


@dataclass(slots=True)
class ShapeGrid:
    """Shapes to measure: every rows × prompt_len with rows × prompt_len ≤ max_tokens."""

    rows: list[int]
    prompt_lens: list[int]
    steps: int = 8  # tokens per run: 1 prefill + decode steps
    max_tokens: int = 2048
    min_rounds: int = 3
    max_rounds: int = 7

    def shapes(self) -> list[tuple[int, int]]:
        """(rows, prompt_len) in measuring order."""
        return [(b, p) for p in self.prompt_lens for b in self.rows if b * p <= self.max_tokens]


QUICK = ShapeGrid([1, 2, 4, 8], [16, 64, 192], steps=8, max_tokens=1536, min_rounds=3, max_rounds=5)
FULL = ShapeGrid([1, 2, 4, 8, 16, 32], [16, 64, 256, 512], steps=12, max_tokens=4096, min_rounds=3, max_rounds=9)


def _rows(rows: int, prompt_len: int, steps: int, rng: random.Random, first_id: int) -> list[BackendRequest]:
    return [BackendRequest.new(first_id + i, prompt_len, steps,
                               [rng.randrange(100, 32000) for _ in range(prompt_len)], 0)
            for i in range(rows)]


def static_round(backend, rows: list[BackendRequest]) -> dict[str, float]:
    """One lockstep batch: {"prefill": launch → first token, "decode": median gap between later steps}."""
    outs: list[StepOutput] = []
    start = now()
    backend.run_batch(rows, outs.append)
    ends = [o.time for o in outs]
    gaps = [b - a for a, b in zip(ends[1 + SKIP_DECODE_STEPS - 1:], ends[1 + SKIP_DECODE_STEPS:])]
    return {"prefill": ends[0] - start, "decode": statistics.median(gaps)}


def stepping_round(backend, rows: list[BackendRequest]) -> dict[str, float]:
    """Every row admitted at once, then stepped: prefill = admit → every row's first token."""
    start = now()
    backend.admit(rows)
    ends, joined, prefill_s = [], 0, 0.0
    while backend.has_work():
        out = backend.step()
        if out is None:
            continue
        joined += out.joined
        if not prefill_s and joined >= len(rows):
            prefill_s = out.time - start
        elif prefill_s:
            ends.append(out.time)
    gaps = [b - a for a, b in zip(ends[SKIP_DECODE_STEPS - 1:], ends[SKIP_DECODE_STEPS:])] if len(ends) > 1 else []
    return {"prefill": prefill_s, "decode": statistics.median(gaps) if gaps else float("nan")}


def measure_shape(backend, rows: int, prompt_len: int, grid: ShapeGrid, rng: random.Random,
                  stepping: bool) -> list[Sample]:
    """A shape warmed once, then repeated until settled: its prefill and decode samples."""
    ids = iter(range(10**6, 10**9, 1000))
    one_round = stepping_round if stepping else static_round
    run = lambda: one_round(backend, _rows(rows, prompt_len, grid.steps, rng, next(ids)))  # noqa: E731
    run()  # warm this shape (kernels, allocator blocks)
    result = settle(run, grid.min_rounds, grid.max_rounds)
    measured = range(1 + SKIP_DECODE_STEPS, grid.steps)  # decode steps whose gaps were timed
    context = rows * statistics.fmean(prompt_len + i for i in measured)  # equal rows: padded = packed
    return [Sample(kind, rows, prompt_len, rows * prompt_len if kind == "prefill" else context,
                   r.value, r.spread, r.rounds, r.settled) for kind, r in result.items()]


def measure_grid(backend, grid: ShapeGrid, stepping: bool, on_shape: Callable[[list[Sample]], None] | None = None,
                 seed: int = 0) -> list[Sample]:
    """Every shape of the grid on a warm backend."""
    rng, samples = random.Random(seed), []
    for rows, prompt_len in grid.shapes():
        shape = measure_shape(backend, rows, prompt_len, grid, rng, stepping)
        samples += shape
        if on_shape is not None:
            on_shape(shape)
    return samples


def run_calibrate(backend: str, model: str, device: str, dtype: str, mode: str, form: str, out: str, grid,
                  name: str, *, say: Callable[[str], None] | None = None, on_shape: Callable | None = None) -> dict:
    """Measure, fit, write the preset to `out`; the calibration record (its per-shape table in "shapes").
    `say`: a line before measuring; `on_shape`: each shape's samples as they are measured."""
    started = time.monotonic()
    engine, stepping, padded = _open_backend(backend, model, device, dtype, mode, max(grid.rows))
    info = engine.info
    form = form if form != "auto" else ("compute" if "cuda" not in str(info.device) else "memory")
    (say or (lambda line: None))(
        f"calibrating {backend} ({_mode(stepping)}) {model} on {info.device}, "
        f"form {form}: {len(grid.shapes())} shapes, load {os.getloadavg()[0]:.1f}")
    samples = measure_grid(engine, grid, stepping, on_shape=on_shape)
    engine.close()
    n_params = info.facts.get("n_params") or 0
    weights = float(n_params * (4 if info.facts.get("dtype", "float32") == "float32" else 2))
    options = dict(form=form, weights_bytes=weights, kv_bytes_per_token=info.kv_bytes_per_token,
                   memory_bytes=(info.kv_budget_bytes + weights) / 0.9, padded=padded,
                   fused=bool(getattr(engine, "fuse", False)), step_tokens=_step_tokens(engine, stepping))
    fitted = fit_model(samples, name, **options)
    fit_err, held_err = errors(fitted, samples), held_out_errors(samples, name, **options)
    record = _record(backend, model, info, stepping, grid, _table(samples, fitted, fit_err, held_err), started)
    save_preset(fitted, out, record)
    return record


def _open_backend(backend: str, model: str, device: str, dtype: str, mode: str, rows: int):
    """(a warm backend, whether it steps continuously, whether it pads rows to the widest); whether it fuses a
    step's decodes and prefill into one forward is the backend's `fuse`."""
    if backend == "vllm":
        from batchlab.worker.vllm_engine import VLLMBackend, VLLMSettings

        engine = VLLMBackend(VLLMSettings(model=model, dtype=dtype, max_num_seqs=rows, kv_cache_bytes=2**30))
        engine.warmup()
        return engine, True, False
    from batchlab.worker.hf.static import HFBackend, HFSettings

    settings = HFSettings(model=model, dtype=dtype, device=device, max_batch_size=rows)
    if mode == BatchingMode.CONTINUOUS:
        from batchlab.worker.hf.continuous import HFContinuousBackend

        loop = HFContinuousBackend(settings)
        loop.warmup()
        return loop, True, True
    static = HFBackend(settings)
    static.warmup()
    return static, False, True


def _step_tokens(engine, stepping: bool) -> int:
    """The measured worker's per-step token budget, which the simulator's continuous steps keep to: the HF
    loop's (its facts say it); 0 for static batches and vLLM (whose default leaves these prompts whole)."""
    return int(engine.info.facts.get("max_num_batched_tokens") or 0) if stepping else 0


def _table(samples: list, model, fit_err: list[float], held_err: list[float]) -> list[dict]:
    return [{"kind": s.kind, "rows": s.rows, "prompt_len": s.prompt_len, "measured_ms": round(1e3 * s.seconds, 3),
             "model_ms": round(1e3 * predict(model, s), 3), "fit_error": round(e, 4),
             "held_out_error": None if math.isnan(h) else round(h, 4), "spread": round(s.spread, 4),
             "rounds": s.rounds, "settled": s.settled} for s, e, h in zip(samples, fit_err, held_err)]


def _summary(table: list[dict], key: str) -> dict:
    out = {}
    for kind in ("prefill", "decode"):
        values = [abs(r[key]) for r in table if r["kind"] == kind and r[key] is not None]
        if values:
            out[kind] = {"mean_abs": round(statistics.fmean(values), 4), "worst_abs": round(max(values), 4)}
    return out


def _mode(stepping: bool) -> BatchingMode:
    """The mode a calibration measured: a backend that steps (joins at step boundaries) is continuous."""
    return BatchingMode.CONTINUOUS if stepping else BatchingMode.STATIC


def _record(backend: str, model: str, info, stepping: bool, grid, table: list[dict], started: float) -> dict:
    noisy = sum(not r["settled"] for r in table)
    return {"backend": backend, "model": model, "device": str(info.device),
            "mode": _mode(stepping).value, "measured": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_1m": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started, 1),
            "grid": {"rows": grid.rows, "prompt_lens": grid.prompt_lens, "steps": grid.steps},
            "fit_error": _summary(table, "fit_error"), "held_out_error": _summary(table, "held_out_error"),
            "unsettled_samples": noisy, "shapes": table}
