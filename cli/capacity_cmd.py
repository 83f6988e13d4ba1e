"""`batchlab capacity CONFIG`: each strategy's saturated rate μ and capacity (the highest arrival rate it
sustains), found by a search below μ; live (each run an ordinary point folder, on warm workers) or in
virtual time."""
from pathlib import Path
from typing import Annotated, Optional

import typer

from batchlab.cli.options import PRESET_PER_KIND, with_settings
from batchlab.protocol.settings import checked_group
from batchlab.protocol.study_settings import CapacitySettings

Config = Annotated[str, typer.Argument(help="sweep YAML (base: and grid:); its grid.rates are not used")]
Out = Annotated[Optional[str], typer.Option(help="output folder (default results/<config>-capacity); with "
                                                "--simulate: where capacity.json goes (nothing written without it)")]
Labels = Annotated[Optional[str], typer.Option("--strategy", help="only these grid labels (comma list)")]
Simulated = Annotated[bool, typer.Option("--simulate", help="search in virtual time (sim backend's model)")]


def run_capacity_cmd(config: str, out: str, labels: list[str] | None, given: dict, simulated: bool,
                     preset: str | None = None) -> dict:
    """Load the plan, search every (or each listed) strategy; capacity.json's content."""
    from batchlab.lab.capacity_search import SimulatedSearch, capacity_document, run_capacity
    from batchlab.lab.capacity_search import search_all
    from batchlab.runner.pool import PoolKeeper
    from batchlab.lab.sweep_plan import SweepError, checked_auto, interleaved, load_plan
    from batchlab.collector.layout import WORKERS_DIR

    plan = load_plan(config)
    unknown = sorted(set(labels or []) - {e.label for e in plan.entries})
    if unknown:
        raise SweepError(f"--strategy: no grid entry labelled {', '.join(unknown)}")
    settings = checked_auto({**(plan.auto.model_dump() if plan.auto else {}),
                             **{k: v for k, v in given.items() if v is not None}}, "capacity options")
    if simulated:
        from batchlab.lab.sim_plan import assign_presets

        plan.base.update({"preset": preset} if preset else {})
        assign_presets(plan)  # each entry plays its own backend's step model, as in `simulate`
        doc = capacity_document(search_all(plan, SimulatedSearch(plan, settings), settings, labels), settings)
        return doc | {"simulated": True}  # no plan_hash: a live search never takes it for its own on resume
    from batchlab.cli.live import SweepView

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with SweepView() as view, PoolKeeper(out_dir / WORKERS_DIR, keep_all=interleaved(plan)) as pools:
        return run_capacity(plan, out_dir, settings, pools, view, labels)


@with_settings(*CapacitySettings.model_fields, schema=CapacitySettings, into="search")
@with_settings("preset", custom={"preset": PRESET_PER_KIND})
def capacity(config: Config, *, overrides: dict, search: dict, out: Out = None, strategy: Labels = None,
             simulate: Simulated = False) -> None:
    """Each strategy's saturated rate μ and capacity (served ≥ 99%, queue not growing, below μ, SLOs met
    by ≥ 90% with SLOs); a search option given here replaces the YAML's grid.rates.auto key."""
    from batchlab.cli import resumable
    from batchlab.report.capacities import capacity_text

    out_given, out = out is not None, out or str(Path("results") / f"{Path(config).stem}-capacity")
    labels = [s.strip() for s in strategy.split(",") if s.strip()] if strategy else None
    checked_group(CapacitySettings, search)  # a bad option is named as given, before the YAML is read
    with resumable(out):
        doc = run_capacity_cmd(config, out, labels, search, simulate, overrides["preset"])
    for line in capacity_text(doc["strategies"]):
        typer.echo(line)
    if not simulate:
        typer.echo(f"capacity.json and every probe's folder in {out}; batchlab report {out} plots the probes")
    elif out_given:  # what the live search writes there, less the probes' folders (its probes ran in virtual time)
        from batchlab.collector.layout import CAPACITY_FILE
        from batchlab.protocol.files import write_json_atomic

        Path(out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(out) / CAPACITY_FILE, doc, default=str)
        typer.echo(f"capacity.json in {out} (searched in virtual time: no probe folders)")
