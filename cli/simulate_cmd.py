"""`batchlab simulate`: a run's traffic, policy and step model in virtual time (no processes, no sleeps)."""
from typing import Annotated, Optional

import typer

from batchlab.cli.grammar import Processes, RayAddress
from batchlab.cli.options import PRESET_PER_KIND, fields_of, option, with_settings
from batchlab.protocol.setting_groups import CollectorSettings, SchedulerSettings, TrafficSettings

ConfigArg = Annotated[Optional[str], typer.Argument(
    help="a sweep YAML (base: and grid:, one folder per point) or a run's settings YAML")]
CUSTOM = {  # the options whose meaning here differs from a run's: comma lists, a simulated worker
    "strategy": option("strategy", help="naive | dynamic | continuous | sjf | edf, a plugin's name or "
                                        "package.module:Class, or a comma list"),
    "preset": PRESET_PER_KIND,
    "rate": option("rate", str, help="arrival rate, requests/s, or a comma list (5,10,20); inf: every request at "
                                     "t = 0 (needs --num-requests)"),
    "out": option("out", help="output folder (default runs/simulated)"),
    "workers": option("workers", help="simulated workers"),
    "memory_budget": option("memory_budget", help="KV memory budget, e.g. 2GiB (default: the preset's)"),
}
SIMULATED = (*fields_of(TrafficSettings), *fields_of(SchedulerSettings), *fields_of(CollectorSettings), "preset",
             "speed_noise", "workers", "memory_budget")


@with_settings(*SIMULATED, custom=CUSTOM)
def simulate(config: ConfigArg = None, *, overrides: dict, processes: Processes = 1, ray: RayAddress = None) -> None:
    """Predict a strategy's latency and throughput in virtual time; writes the tables a live run writes."""
    from batchlab import api
    from batchlab.runner.outcome import verdict

    result = api.simulate(config, processes=processes, ray=ray, **overrides)
    summaries = result.summaries()
    _print_table(result.records, summaries)
    for record in result.records:  # a point whose requests a fault ended (a stalled policy): its line, exit 2
        code, line = verdict(summaries[record.key], [])
        if code:
            load = f"{record.concurrency} clients" if record.concurrency else f"{record.rate:g} req/s"
            typer.secho(f"error: {record.label} at {load}: {line}", fg="red", err=True)
            raise typer.Exit(code=code)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_table(records: list, summaries: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("strategy", "rate", "finished", "tok/s", "req/s", "TTFT p50 s", "TTFT p99 s", "E2E p50 s",
                  "E2E p99 s", "out", title="simulated")
    for r in records:
        s = summaries[r.key]
        table.add_row(r.label, f"{r.concurrency} clients" if r.concurrency else f"{r.rate:g}",
                      f"{s.finished}/{s.submitted}", f"{s.throughput_tok_s:.0f}", f"{s.requests_per_s:.2f}",
                      *map(_seconds, (s.ttft.p50, s.ttft.p99, s.e2e.p50, s.e2e.p99)), str(r.folder))
    Console(width=160).print(table)
