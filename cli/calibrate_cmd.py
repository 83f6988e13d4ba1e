"""`batchlab calibrate`: measure a real backend's step times on this machine and fit a step-model preset.

    batchlab calibrate --backend hf --model tiny-mistral --quick --out presets/cpu-tiny-mistral.yaml
    batchlab calibrate --from results/cpu --kind hf-loop --out presets/hf-loop.yaml   # from live runs

The first measures a warm backend in this process over a grid (a clean machine's step times); the second
fits the steps live workers executed in runs (cli.calibrate_from), contention and every real cost included.

The preset file is accepted wherever a preset name is (`--preset PATH`: simulate, tune, the sim worker).
"""
import math
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli.options import Opt, with_settings
from batchlab.protocol.settings import checked_group
from batchlab.protocol.study_settings import CalibrateSettings

FromOpt = Annotated[Optional[list[str]], Opt("--from", help="fit the steps live workers executed in these run "
                                                            "folders (or folders of runs: a sweep) instead of "
                                                            "measuring; several: --from A B C (or --from A --from B)")]
# the folders after --from's first: an option takes one value each time it is given, so `--from A B` hands B
# over as an argument, and it joins --from's list
MoreOpt = Annotated[Optional[list[str]], typer.Argument(metavar="RUN_DIR...", help="more run folders for --from",
                                                         show_default=False)]


@with_settings(*CalibrateSettings.model_fields, schema=CalibrateSettings, into="given")
def calibrate(more_runs: MoreOpt = None, *, given: dict, from_runs: FromOpt = None) -> None:
    """Measure prefill and decode step times over a grid (or read them from runs), fit the step model, write a
    preset file."""
    s = checked_group(CalibrateSettings, given)
    name = s.name or Path(s.out).stem
    from_runs = [*(from_runs or []), *(more_runs or [])]
    if from_runs:
        from batchlab.cli.calibrate_from import calibrate_from

        calibrate_from(from_runs, kind=s.kind, form=s.form, out=s.out, name=name, weigh=s.weigh)
        return
    from batchlab.worker.calibrate_measure import FULL, QUICK

    grid = replace(QUICK if s.quick else FULL)  # a copy: the options below must not change the module's grid
    if s.batch_sizes:
        grid.rows = [int(v) for v in s.batch_sizes.split(",")]
    if s.prompt_lens:
        grid.prompt_lens = [int(v) for v in s.prompt_lens.split(",")]
    run_calibrate(s.backend, s.model, s.device, s.dtype, s.mode, s.form, s.out, grid, name)


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


def run_calibrate(backend: str, model: str, device: str, dtype: str, mode: str, form: str, out: str, grid,
                  name: str) -> dict:
    """Measure, fit, print the per-shape table, write the preset; the calibration record."""
    from batchlab.worker.calibrate import errors, fit_model, held_out_errors
    from batchlab.worker.calibrate_measure import measure_grid
    from batchlab.worker.stepmodel import save_preset

    started = time.monotonic()
    engine, stepping, padded = _open_backend(backend, model, device, dtype, mode, max(grid.rows))
    info = engine.info
    form = form if form != "auto" else ("compute" if "cuda" not in str(info.device) else "memory")
    typer.echo(f"calibrating {backend} ({'continuous' if stepping else 'static'}) {model} on {info.device}, "
               f"form {form}: {len(grid.shapes())} shapes, load {os.getloadavg()[0]:.1f}")
    samples = measure_grid(engine, grid, stepping, on_shape=_print_progress)
    engine.close()
    n_params = info.facts.get("n_params") or 0
    weights = float(n_params * (4 if info.facts.get("dtype", "float32") == "float32" else 2))
    options = dict(form=form, weights_bytes=weights, kv_bytes_per_token=info.kv_bytes_per_token,
                   memory_bytes=(info.kv_budget_bytes + weights) / 0.9, padded=padded,
                   fused=bool(getattr(engine, "fuse", False)), step_tokens=_step_tokens(engine, stepping))
    fitted = fit_model(samples, name, **options)
    fit_err, held_err = errors(fitted, samples), held_out_errors(samples, name, **options)
    table = _table(samples, fitted, fit_err, held_err)
    record = _record(backend, model, info, stepping, grid, table, started)
    _print_table(table, record)
    save_preset(fitted, out, record)
    typer.echo(f"wrote {out} (use --preset {out})")
    return record


def _step_tokens(engine, stepping: bool) -> int:
    """The measured worker's per-step token budget, which the simulator's continuous steps keep to: the HF
    loop's (its facts say it); 0 for static batches and vLLM (whose default leaves these prompts whole)."""
    return int(engine.info.facts.get("max_num_batched_tokens") or 0) if stepping else 0


def _print_progress(shape: list) -> None:
    s = shape[0]
    typer.echo(f"  B={s.rows:<3} P={s.prompt_len:<4} " + "  ".join(
        f"{x.kind} {1e3 * x.seconds:7.2f} ms ±{x.spread:.0%} ({x.rounds} rounds{'' if x.settled else ', noisy'})"
        for x in shape))


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


def _print_table(table: list[dict], record: dict) -> None:
    typer.echo(f"{'kind':<8}{'B':>4}{'P':>5}{'measured ms':>13}{'model ms':>10}{'fit err':>9}{'held-out':>10}"
               f"{'spread':>8}")
    for r in table:
        held = "-" if r["held_out_error"] is None else f"{r['held_out_error']:+.1%}"
        typer.echo(f"{r['kind']:<8}{r['rows']:>4}{r['prompt_len']:>5}{r['measured_ms']:>13.2f}{r['model_ms']:>10.2f}"
                   f"{r['fit_error']:>+9.1%}{held:>10}{r['spread']:>8.1%}{'' if r['settled'] else '  noisy'}")
    for key in ("fit_error", "held_out_error"):
        typer.echo(f"{key.replace('_', ' ')}: " + ", ".join(
            f"{k} mean {v['mean_abs']:.1%} worst {v['worst_abs']:.1%}" for k, v in record[key].items()))
    if record["unsettled_samples"]:
        typer.echo(f"warning: {record['unsettled_samples']} of {len(table)} samples did not settle within "
                   f"their rounds (load {record['load_average_1m']}): the machine was too noisy; "
                   "refit when it is quiet")
