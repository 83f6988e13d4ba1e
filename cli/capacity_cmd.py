"""`batchlab capacity CONFIG`: each strategy's saturated rate μ and capacity (the highest arrival rate it
sustains), found by a search below μ; live (each run an ordinary point folder, on warm workers) or in
virtual time."""
from typing import Annotated, Optional

import typer

from batchlab.cli.options import PRESET_PER_KIND, with_settings
from batchlab.lab.sweep_plan import CAPACITY_SUFFIX, study_folder
from batchlab.protocol.study_settings import CapacitySettings

Config = Annotated[str, typer.Argument(help="sweep YAML (base: and grid:); its grid.rates are not used")]
Out = Annotated[Optional[str], typer.Option(help="output folder (default results/<config>-capacity); with "
                                                "--simulate: where capacity.json goes (nothing written without it)")]
Labels = Annotated[Optional[str], typer.Option("--strategy", help="only these grid labels (comma list)")]
Simulated = Annotated[bool, typer.Option("--simulate", help="search in virtual time (sim backend's model)")]


@with_settings(*CapacitySettings.model_fields, schema=CapacitySettings, into="search")
@with_settings("preset", custom={"preset": PRESET_PER_KIND})
def capacity(config: Config, *, overrides: dict, search: dict, out: Out = None, strategy: Labels = None,
             simulate: Simulated = False) -> None:
    """Each strategy's saturated rate μ and capacity (served ≥ 99%, queue not growing, below μ, SLOs met
    by ≥ 90% with SLOs); a search option given here replaces the YAML's grid.rates.auto key."""
    from batchlab import api
    from batchlab.cli import resumable
    from batchlab.cli.live import SweepView

    out_given, out = out is not None, out or str(study_folder(config, CAPACITY_SUFFIX))
    labels = [s.strip() for s in strategy.split(",") if s.strip()] if strategy else None
    with resumable(out):
        if simulate:  # capacity.json goes to `out` only when it was given
            result = api.capacity(config, out if out_given else None, strategies=labels, simulated=True,
                                  preset=overrides["preset"], **search)
        else:
            with SweepView() as view:
                result = api.capacity(config, out, strategies=labels, on_progress=view, **search)
    for line in result.lines():
        typer.echo(line)
    if not simulate:
        typer.echo(f"capacity.json and every probe's folder in {out}; batchlab report {out} plots the probes")
    elif out_given:  # what the live search writes there, less the probes' folders (its probes ran in virtual time)
        typer.echo(f"capacity.json in {out} (searched in virtual time: no probe folders)")
