"""`batchlab report DIR`: plots and REPORT.md from a sweep folder or a single run folder."""
from pathlib import Path
from typing import Annotated, Optional

import typer


Folder = Annotated[str, typer.Argument(help="a sweep's --out folder, or one run's folder")]
Rate = Annotated[Optional[float], typer.Option(help="rate (req/s) of the CDF and timeline plots")]
Slo = Annotated[Optional[list[str]], typer.Option(help="SLO for goodput, e.g. ttft=500ms (repeatable)")]


def register(app: typer.Typer) -> None:
    """Add `batchlab report` to the app."""

    @app.command()
    def report(folder: Folder, *, rate: Rate = None, slo: Slo = None) -> None:
        """Plots (PNG) and REPORT.md: latency vs throughput, CDFs, batch timeline, tables per rate; each
        live sim/echo run's summary.json first gains its timing fidelity (against the simulator)."""
        from batchlab.collector.report.build import parse_slos, run_report
        from batchlab.collector.report.points import ReportError
        from batchlab.scheduler.simulator.fidelity import add_folder_fidelity

        try:
            slos = parse_slos(slo or [])
            if Path(folder).is_dir():
                add_folder_fidelity(folder)
            result = run_report(folder, rate=rate, slos=slos)
        except ReportError as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(code=1) from None
        typer.echo("capacity (estimate [highest sustained, lowest not sustained]):")
        for line in result.capacity_lines:
            typer.echo(f"  {line}")
        for line in result.headlines:
            typer.echo(f"- {line}")
        typer.echo(f"report: {result.path} ({len(result.plots)} plots beside it)")
