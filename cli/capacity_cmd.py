"""`batchlab capacity CONFIG`: each strategy's saturated rate μ and capacity (the highest arrival rate it
sustains), found by a search below μ; live (each run an ordinary point folder, on warm workers) or in
virtual time."""
from pathlib import Path
from typing import Annotated, Optional

import typer

Config = Annotated[str, typer.Argument(help="sweep YAML (base: and grid:); its grid.rates are not used")]
Out = Annotated[Optional[str], typer.Option(help="output folder (default results/<config>-capacity); with "
                                                "--simulate: where capacity.json goes (nothing written without it)")]
Labels = Annotated[Optional[str], typer.Option("--strategy", help="only these grid labels (comma list)")]
Duration = Annotated[Optional[float], typer.Option("--duration-s", help="traffic per probe, s")]
Saturated = Annotated[Optional[float], typer.Option("--saturated-s", help="traffic per saturated run (μ), s")]
Width = Annotated[Optional[float], typer.Option(help="stop when hi / lo ≤ 1 + width")]
Probes = Annotated[Optional[int], typer.Option(help="at most this many probes per strategy")]
Simulated = Annotated[bool, typer.Option("--simulate", help="search in virtual time (sim backend's model)")]
Preset = Annotated[Optional[str], typer.Option(help="with --simulate: the step-time preset (name or file), or "
                                                   "one per backend kind: hf=P,hf-loop=P,vllm=P")]


def run_capacity_cmd(config: str, out: str | None, labels: list[str] | None, given: dict, simulated: bool,
                     preset: str | None = None) -> dict:
    """batchlab.api.capacity with the terminal's live view (a live search); capacity.json's content.
    Simulated, capacity.json goes to `out` only when it is not None."""
    from batchlab import api
    from batchlab.collector.report.live import SweepView

    if simulated:
        return api.capacity(config, out, strategies=labels, simulated=True, preset=preset, **given).doc
    with SweepView() as view:
        return api.capacity(config, out, strategies=labels, on_progress=view, **given).doc


def capacity(config: Config, *, out: Out = None, strategy: Labels = None, duration_s: Duration = None,
             saturated_s: Saturated = None, width: Width = None, max_probes: Probes = None,
             simulate: Simulated = False, preset: Preset = None) -> None:
    """Each strategy's saturated rate μ and capacity (served ≥ 99%, queue not growing, below μ, SLOs met
    by ≥ 90% with SLOs)."""
    from batchlab.cli.outcome import resumable
    from batchlab.collector.report.capacities import capacity_text

    out_given, out = out is not None, out or str(Path("results") / f"{Path(config).stem}-capacity")
    labels = [s.strip() for s in strategy.split(",") if s.strip()] if strategy else None
    given = {"search_duration_s": duration_s, "saturated_duration_s": saturated_s, "width": width,
             "max_probes": max_probes}
    with resumable(out):
        doc = run_capacity_cmd(config, out if out_given or not simulate else None, labels, given, simulate, preset)
    for line in capacity_text(doc["strategies"]):
        typer.echo(line)
    if not simulate:
        typer.echo(f"capacity.json and every probe's folder in {out}; batchlab report {out} plots the probes")
    elif out_given:  # what the live search writes there, less the probes' folders (its probes ran in virtual time)
        typer.echo(f"capacity.json in {out} (searched in virtual time: no probe folders)")
