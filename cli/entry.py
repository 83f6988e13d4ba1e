"""The `batchlab` command's entry (its console script): a Ctrl-C while the commands import is a quiet exit 130
(no traceback; nothing exists yet), then cli.main's main. Importing this module installs nothing."""
from batchlab.protocol.signals import exit_on_sigint_while_importing


def main() -> None:
    """The `batchlab` command: a quiet Ctrl-C until typer's main takes it back (cli.main), then the command."""
    exit_on_sigint_while_importing()
    from batchlab.cli.main import main as run_command

    run_command()
