"""`batchlab sweep CONFIG`: strategies × backends × rates × repeats, one real run per point, resumable
(batchlab.api.sweep; lab.sweep's docstring gives the folder's layout; with --ray, lab.ray_sweep)."""
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli.grammar import ray_option
from batchlab.cli.options import with_settings
from batchlab.lab.sweep_plan import parse_sets, study_folder
from batchlab.collector.layout import INDEX_FILE
from batchlab.protocol.study_settings import GRID_KEYS, RaySettings, ray_settings


@with_settings("cpus", "gpu_resource", "shared", schema=RaySettings, into="cluster")
def sweep(config: Annotated[str, typer.Argument(help="sweep YAML (base: and grid:)")], *,
          out: Annotated[Optional[str], typer.Option(help="output folder")] = None,
          resume: Annotated[bool, typer.Option(help="skip points already done")] = True,
          set_: Annotated[Optional[list[str]], typer.Option(
              "--set", help="override a setting of every run, KEY=VALUE (a RunConfig name, e.g. duration_s=5), "
                            f"or a grid key, [grid.]KEY=VALUE ({', '.join(GRID_KEYS)}; e.g. repeats=2); "
                            "grid.rates.auto.KEY=VALUE: one setting of the automatic rates' search (e.g. "
                            "grid.rates.auto.twin=false); "
                            "base.KEY=VALUE: a run's setting of a grid key's name; repeatable")] = None,
          ray: Annotated[Optional[str], ray_option(
              help="run the points on a Ray cluster (ADDRESS as RAY_ADDRESS: host:port, auto; "
                   "alone: a local Ray); see docs/ray.md")] = None,
          save_result: Annotated[Optional[str], typer.Option(
              help="also write the points' results into this folder in `vllm bench sweep`'s layout (a "
                   "summary.json per point), for `batchlab vllm bench sweep plot_pareto DIR`")] = None,
          cluster: dict) -> None:
    """Run a grid of strategies × backends × rates × repeats, one real run per point."""
    from batchlab import api
    from batchlab.cli import resumable
    from batchlab.cli.live import SweepView

    out = out or str(study_folder(config))
    sets = parse_sets(set_)  # a bad --set or --ray-* option: one line before the live view starts
    opts = None if ray is None else ray_settings({**cluster, "address": ray})  # api.sweep's own check
    with resumable(out), SweepView(figures=True) as view:
        result = api.sweep(config, out, resume=resume, on_progress=view, ray=opts, save_result=save_result, **sets)
    typer.echo(f"sweep in {out}: {result.measured} of {len(result.records)} points done, {result.failed} failed "
               f"(see {Path(out) / INDEX_FILE})")
    if save_result:
        typer.echo(f"vllm bench sweep layout: {save_result}")
    if result.measured == 0:
        raise typer.Exit(code=1)
    from batchlab.cli.report_cmd import echo_report
    from batchlab.report.points import ReportError

    try:  # the capacity table and headline, as `batchlab report` prints them (its REPORT.md written too)
        echo_report(out)
    except ReportError as exc:  # a report that cannot be made: one line and exit 1, the sweep's runs kept
        typer.echo(f"no report: {exc}; the runs are in {out} (batchlab report {out} tries again)", err=True)
        raise typer.Exit(code=1) from None
