"""`batchlab calibrate`: measure a real backend's step times on this machine and fit a step-model preset.

    batchlab calibrate --backend hf --model tiny-mistral --quick --out presets/cpu-tiny-mistral.yaml
    batchlab calibrate --from results/cpu --kind hf-loop --out presets/hf-loop.yaml   # from live runs

The first measures a warm backend in this process over a grid (a clean machine's step times); the second
fits the steps live workers executed in runs (lab.calibrate_runs), contention and every real cost included.

The preset file is accepted wherever a preset name is (`--preset PATH`: simulate, tune, the sim worker).
"""
import math
from typing import Annotated, Optional

import typer

from batchlab.cli.options import Opt, with_settings
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
    from batchlab import api

    from_runs = [*(from_runs or []), *(more_runs or [])]
    result = api.calibrate(runs=from_runs or None, on_progress=lambda event: typer.echo(event.text),
                           **{k: v for k, v in given.items() if v is not None})
    if from_runs:
        _print_from_runs(result.points(), result.record)
        return
    _print_table(result.record["shapes"], result.record)
    typer.echo(f"wrote {result.preset} (use --preset {result.preset})")


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
        held = "-" if r.held_out_error is None or math.isnan(r.held_out_error) else f"{r.held_out_error:+.1%}"
        typer.echo(f"{r.kind:<8}{r.decode_rows:>9}{ctx:>8.0f}{r.prefill_rows:>10}{tok:>8.0f}{r.steps:>7}"
                   f"{1e3 * r.seconds:>13.2f}{1e3 * r.model_s:>10.2f}{r.fit_error:>+9.1%}{held:>10}")
    for key in ("fit_error", "held_out_error"):
        typer.echo(f"{key.replace('_', ' ')}: " + ", ".join(
            f"{k} mean {v['mean_abs']:.1%} worst {v['worst_abs']:.1%}" for k, v in record[key].items()))
    typer.echo(f"total step time: model {record['total_time_error']:+.1%} of measured ({record['steps']} steps)")
