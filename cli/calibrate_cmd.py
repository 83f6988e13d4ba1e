"""`batchlab calibrate`: measure a real backend's step times on this machine and fit a step-model preset.

    batchlab calibrate --backend hf --model tiny-mistral --quick --out presets/cpu-tiny-mistral.yaml
    batchlab calibrate --from results/cpu --kind hf-loop --out presets/hf-loop.yaml   # from live runs

The first measures a warm backend in this process over a grid (a clean machine's step times); the second
fits the steps live workers executed in runs (lab.calibrate_from), contention and every real cost included.

The preset file is accepted wherever a preset name is (`--preset PATH`: simulate, tune, the sim worker).
"""
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli.options import Opt

BackendOpt = Annotated[str, Opt(help="hf (static generate() or, with --mode continuous, the HF loop) | vllm")]
ModelOpt = Annotated[str, Opt(help="a hub id, a local path or tiny-mistral")]
DeviceOpt = Annotated[str, Opt(help="auto | cpu | cuda | cuda:N (hf)")]
DtypeOpt = Annotated[str, Opt(help="auto | float32 | float16 | bfloat16")]
ModeOpt = Annotated[str, Opt(help="static | continuous (hf; vllm is always continuous)")]
FormOpt = Annotated[str, Opt(help="compute (a CPU) | memory (a GPU: the bandwidth form) | auto (by device)")]
OutOpt = Annotated[str, Opt(help="the preset file to write (.yaml)")]
QuickOpt = Annotated[bool, Opt(help="a small grid (B 1-8 × P 16-192) that runs in minutes on 2 cores")]
NameOpt = Annotated[str, Opt(help="the preset's name (default: the file's stem)")]
RowsOpt = Annotated[str, Opt(help="batch sizes, a comma list (default: the grid's)")]
LensOpt = Annotated[str, Opt(help="prompt lengths, a comma list (default: the grid's)")]
FromOpt = Annotated[Optional[list[str]], Opt("--from", help="fit the steps live workers executed in these run "
                                                            "folders (or folders of runs: a sweep) instead of "
                                                            "measuring; several: --from A B C (or --from A --from B)")]
# the folders after --from's first: an option takes one value each time it is given, so `--from A B` hands B
# over as an argument, and it joins --from's list
MoreOpt = Annotated[Optional[list[str]], typer.Argument(metavar="RUN_DIR...", help="more run folders for --from",
                                                         show_default=False)]
WeighOpt = Annotated[str, Opt(help="with --from: a step shape weighs by its steps (√n) or by its share of the "
                                    "runs' time (time)")]
KindOpt = Annotated[str, Opt(help="with --from: the runs' backend kind to fit, hf | hf-loop | vllm | sim "
                                  "(needed when the folders hold several)")]


def calibrate(more_runs: MoreOpt = None, *, backend: BackendOpt = "hf", model: ModelOpt = "tiny-mistral",
              device: DeviceOpt = "auto", dtype: DtypeOpt = "auto", mode: ModeOpt = "static", form: FormOpt = "auto",
              out: OutOpt = "presets/calibrated.yaml", quick: QuickOpt = False, name: NameOpt = "",
              batch_sizes: RowsOpt = "", prompt_lens: LensOpt = "", from_runs: FromOpt = None,
              kind: KindOpt = "", weigh: WeighOpt = "steps") -> None:
    """Measure prefill and decode step times over a grid (or read them from runs), fit the step model, write a
    preset file."""
    from_runs = [*(from_runs or []), *(more_runs or [])]
    if from_runs:
        from batchlab.lab.calibrate_from import calibrate_from

        calibrate_from(from_runs, kind=kind, form=form, out=out, name=name or Path(out).stem, weigh=weigh,
                       say=typer.echo, show=_print_from_runs)
        return
    from batchlab.lab.calibrate_measure import FULL, QUICK

    grid = replace(QUICK if quick else FULL)  # a copy: the options below must not change the module's grid
    if batch_sizes:
        grid.rows = [int(v) for v in batch_sizes.split(",")]
    if prompt_lens:
        grid.prompt_lens = [int(v) for v in prompt_lens.split(",")]
    if backend not in ("hf", "vllm"):
        raise ValueError(f"--backend must be hf or vllm, not {backend!r}")
    _run_calibrate(backend, model, device, dtype, mode, form, out, grid, name or Path(out).stem)


def _run_calibrate(backend: str, model: str, device: str, dtype: str, mode: str, form: str, out: str, grid,
                   name: str) -> dict:
    """lab.calibrate_measure.run_calibrate, its progress, per-shape table and preset file printed."""
    from batchlab.lab.calibrate_measure import run_calibrate

    record = run_calibrate(backend, model, device, dtype, mode, form, out, grid, name, say=typer.echo,
                           on_shape=_print_progress)
    _print_table(record["shapes"], record)
    typer.echo(f"wrote {out} (use --preset {out})")
    return record


def _print_progress(shape: list) -> None:
    s = shape[0]
    typer.echo(f"  B={s.rows:<3} P={s.prompt_len:<4} " + "  ".join(
        f"{x.kind} {1e3 * x.seconds:7.2f} ms ±{x.spread:.0%} ({x.rounds} rounds{'' if x.settled else ', noisy'})"
        for x in shape))


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


def _print_from_runs(table, record: dict) -> None:
    typer.echo(f"{'kind':<8}{'decode B':>9}{'ctx/row':>8}{'prefill B':>10}{'tok/row':>8}{'steps':>7}"
               f"{'measured ms':>13}{'model ms':>10}{'fit err':>9}{'held-out':>10}")
    for r in table.itertuples(index=False):
        ctx = r.decode_context / r.decode_rows if r.decode_rows else 0
        tok = r.prefill_tokens / r.prefill_rows if r.prefill_rows else 0
        held = "-" if math.isnan(r.held_out_error) else f"{r.held_out_error:+.1%}"
        typer.echo(f"{r.kind:<8}{r.decode_rows:>9}{ctx:>8.0f}{r.prefill_rows:>10}{tok:>8.0f}{r.steps:>7}"
                   f"{1e3 * r.seconds:>13.2f}{1e3 * r.model_s:>10.2f}{r.fit_error:>+9.1%}{held:>10}")
    for key in ("fit_error", "held_out_error"):
        typer.echo(f"{key.replace('_', ' ')}: " + ", ".join(
            f"{k} mean {v['mean_abs']:.1%} worst {v['worst_abs']:.1%}" for k, v in record[key].items()))
    typer.echo(f"total step time: model {record['total_time_error']:+.1%} of measured ({record['steps']} steps)")
