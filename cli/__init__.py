"""The `batchlab` command line: the typer commands (parse, call the library, print) and the terminal views.

A Ctrl-C while it is still importing (a second or so, before any process or file exists) ends it quietly
with exit code 130, and so does one after the command has ended; main.py hands SIGINT back to Python
inside typer's main, which makes its KeyboardInterrupt exit 130 too. Imported by another program (a
notebook, a test), this package changes no signal handler of that program's process. A child that `batchlab
run` spawned is left to batchlab.runner, imported first here, which links it to its launcher.
"""
import contextlib
import sys
from pathlib import Path

from batchlab.protocol.signals import (exit_on_sigint_while_importing, forget_handled_interrupt,  # noqa: F401
                                      restore_sigint)  # (cli.main's)
from batchlab.runner import SPAWNED

# The batchlab command itself: its console script, or `python -m batchlab.cli.main` (argv[0] reads "-m" while
# the packages of the -m module import). A program that imports batchlab as a library keeps its handlers.
COMMAND = sys.argv[:1] == ["-m"] or Path(sys.argv[0] if sys.argv else "").name == "batchlab"


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


if not SPAWNED and COMMAND:
    exit_on_sigint_while_importing()
