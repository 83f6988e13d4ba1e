"""`batchlab report DIR`: plots and REPORT.md from a sweep folder or a single run folder."""
from typing import Annotated, Optional

import typer

from batchlab.cli.options import SLO_HELP


Folder = Annotated[str, typer.Argument(help="a sweep's --out folder, or one run's folder")]
Rate = Annotated[Optional[float], typer.Option(help="rate (req/s) of the CDF and timeline plots")]
Slo = Annotated[Optional[list[str]], typer.Option(help=SLO_HELP)]
Out = Annotated[Optional[str], typer.Option(help="where REPORT.md and the plots go (default: FOLDER); the runs' "
                                            "own files are only read")]
Extra = Annotated[Optional[list[str]], typer.Option(
    help="another tool's result file to draw beside the strategies: vllm bench serve --save-result JSON, "
         "GuideLLM benchmarks.json or AIPerf profile_export_aiperf.json (repeatable; such files directly in "
         "FOLDER are found too)")]


def report(folder: Folder, *, rate: Rate = None, slo: Slo = None, out: Out = None, extra: Extra = None) -> None:
    """Plots (PNG), REPORT.md and REPORT.html (interactive, self-contained): latency vs throughput, CDFs,
    batch timeline, tables per rate, other tools' results (--extra). Reads the runs and writes nothing
    into their files (a run's figures are computed when it ends)."""
    from batchlab.report.points import ReportError

    try:  # the SLOs are api.report's to check, as from Python
        echo_report(folder, rate=rate, slos=slo or [], out=out, extra=extra)
    except ReportError as exc:  # one line per file it refused, then exit 1 (nothing was written)
        for line in exc.lines:
            typer.secho(f"error: {' '.join(line.split())}", fg="red", err=True)
        raise typer.Exit(code=1) from None


def echo_report(folder: str, **options) -> None:
    """Write the report of `folder` and print its capacity table, headline and where it went (the end of
    `batchlab report`, and of `batchlab sweep`); ReportError when a file it reads is refused."""
    from batchlab import api

    result = api.report(folder, **options)
    if result.capacity_lines:  # none for closed-loop runs (no offered rate) or runs that measured nothing
        typer.echo("capacity (estimate [highest sustained, lowest not sustained]):")
    for line in result.capacity_lines:
        typer.echo(f"  {line}")
    for line in result.headlines:
        typer.echo(f"- {line}")
    for line in result.machine_lines:  # what else the machine ran meanwhile (report.machine)
        typer.echo(line)
    typer.echo(f"report: {result.path} ({len(result.plots)} plots beside it)")
