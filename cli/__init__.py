"""The `batchlab` command line: the typer commands (parse, call the library, print) and the terminal views.

Its entry (cli.entry's main: the console script; `python -m batchlab.cli.main`) makes a Ctrl-C while it is still
importing (a second or so, before any process or file exists) a quiet exit 130, and one after the command has
ended too; main.py hands SIGINT back to Python inside typer's main, which makes its KeyboardInterrupt exit 130
too. Importing this package, or any of its modules, changes no signal handler (a notebook, a test).
"""
import contextlib


@contextlib.contextmanager
def resumable(out: str):
    """A Ctrl-C (or a SIGTERM) inside ends the command with a line saying how to resume in `out`."""
    import typer

    from batchlab.runner.outcome import interrupted_exit

    try:
        yield
    except KeyboardInterrupt as exc:
        typer.secho(f"interrupted; run the same command again to resume in {out}", err=True)
        raise typer.Exit(code=interrupted_exit(exc)) from None

