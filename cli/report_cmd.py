"""`batchlab report DIR`: plots and REPORT.md from a sweep folder or a single run folder."""
from typing import Annotated, Optional

import typer


Folder = Annotated[str, typer.Argument(help="a sweep's --out folder, or one run's folder")]
Rate = Annotated[Optional[float], typer.Option(help="rate (req/s) of the CDF and timeline plots")]
Slo = Annotated[Optional[list[str]], typer.Option(help="SLO for goodput, e.g. ttft=500ms (repeatable)")]


def register(app: typer.Typer) -> None:
    """Add `batchlab report` to the app."""

    @app.command()
    def report(folder: Folder, *, rate: Rate = None, slo: Slo = None) -> None:
        """Plots (PNG) and REPORT.md: latency vs throughput, CDFs, batch timeline, tables per rate."""
        from batchlab.collector.report.build import parse_slos, run_report
        from batchlab.collector.report.points import ReportError

        try:
            result = run_report(folder, rate=rate, slos=parse_slos(slo or []))
        except ReportError as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(code=1) from None
        for line in result.headlines:
            typer.echo(line)
        typer.echo(f"report: {result.path} ({len(result.plots)} plots beside it)")
