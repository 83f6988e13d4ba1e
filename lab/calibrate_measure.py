"""Calibration's measuring half: real step times of a warm backend over a grid of batch sizes and
prompt lengths, each shape repeated until its spread settles (worker.calibrate.settle).

Static backends (HF generate()) run a lockstep batch: the prefill is timed from the run_batch call to
the first token (what the simulator counts from a batch's launch), decode steps as the gaps between
step ends. Continuous backends (the HF loop, vLLM) get every row admitted at once and are stepped; the
prefill is the steps until every row has its first token. Decode steps skip the first one after the
prefill (its cache still grows) and report their median.
"""
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from batchlab.protocol.clock import now
from batchlab.worker.backend import Row, StepOutput
from batchlab.worker.calibrate import Sample, settle

SKIP_DECODE_STEPS = 1


@dataclass(slots=True)
class Grid:
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


QUICK = Grid([1, 2, 4, 8], [16, 64, 192], steps=8, max_tokens=1536, min_rounds=3, max_rounds=5)
FULL = Grid([1, 2, 4, 8, 16, 32], [16, 64, 256, 512], steps=12, max_tokens=4096, min_rounds=3, max_rounds=9)


def _rows(rows: int, prompt_len: int, steps: int, rng: random.Random, first_id: int) -> list[Row]:
    return [Row(first_id + i, prompt_len, steps, [rng.randrange(100, 32000) for _ in range(prompt_len)], 0)
            for i in range(rows)]


def static_round(backend, rows: list[Row]) -> dict[str, float]:
    """One lockstep batch: {"prefill": launch → first token, "decode": median gap between later steps}."""
    outs: list[StepOutput] = []
    start = now()
    backend.run_batch(rows, outs.append)
    ends = [o.time for o in outs]
    gaps = [b - a for a, b in zip(ends[1 + SKIP_DECODE_STEPS - 1:], ends[1 + SKIP_DECODE_STEPS:])]
    return {"prefill": ends[0] - start, "decode": statistics.median(gaps)}


def stepping_round(backend, rows: list[Row]) -> dict[str, float]:
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


def measure_shape(backend, rows: int, prompt_len: int, grid: Grid, rng: random.Random, stepping: bool) -> list[Sample]:
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


def measure_grid(backend, grid: Grid, stepping: bool, on_shape: Callable[[list[Sample]], None] | None = None,
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
    from batchlab.worker.calibrate import errors, fit_model, held_out_errors
    from batchlab.worker.stepmodel import save_preset

    started = time.monotonic()
    engine, stepping, padded = _open_backend(backend, model, device, dtype, mode, max(grid.rows))
    info = engine.info
    form = form if form != "auto" else ("compute" if "cuda" not in str(info.device) else "memory")
    (say or (lambda line: None))(
        f"calibrating {backend} ({'continuous' if stepping else 'static'}) {model} on {info.device}, "
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
    if mode == "continuous":
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
    from batchlab.worker.calibrate import predict

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


def _record(backend: str, model: str, info, stepping: bool, grid, table: list[dict], started: float) -> dict:
    noisy = sum(not r["settled"] for r in table)
    return {"backend": backend, "model": model, "device": str(info.device),
            "mode": "continuous" if stepping else "static", "measured": time.strftime("%Y-%m-%d %H:%M"),
            "load_average_1m": round(os.getloadavg()[0], 2), "wall_s": round(time.monotonic() - started, 1),
            "grid": {"rows": grid.rows, "prompt_lens": grid.prompt_lens, "steps": grid.steps},
            "fit_error": _summary(table, "fit_error"), "held_out_error": _summary(table, "held_out_error"),
            "unsettled_samples": noisy, "shapes": table}
