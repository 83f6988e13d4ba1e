"""The `batchlab` command. Each command is a thin wrapper; heavy imports happen inside commands."""
if __name__ == "__main__":  # `python -m batchlab.cli.main`: the command's entry (as cli.entry's), before the imports
    from batchlab.protocol.signals import exit_on_sigint_while_importing

    exit_on_sigint_while_importing()  # a Ctrl-C until typer's main takes it back (restore_sigint): quiet, 130

import signal
import sys
from typing import Annotated, NoReturn

import click
import typer
from typer.core import TyperGroup

try:  # typer 0.29 vendors click: the usage errors it raises are typer._click's, not click's
    from typer._click.exceptions import NoArgsIsHelpError, UsageError
except ImportError:  # a typer that uses click itself
    from click.exceptions import NoArgsIsHelpError, UsageError

from batchlab.cli import report_cmd, simulate_cmd, sweep_cmd
from batchlab.runner.config import replay_config
from batchlab.runner.preflight import checked_config
from batchlab.cli.grammar import show_version
from batchlab.protocol.addresses import DEFAULT
from batchlab.protocol.settings import RunConfig, load_yaml, refuse_ignored
from batchlab.protocol.signals import exit_on_sigint_while_importing, forget_handled_interrupt, restore_sigint
from batchlab.cli.model_cmd import model_app
from batchlab.cli.options import (CLI_FIELDS, ConfigOpt, Opt, Overwrite, SaveDetailed, SaveResult, fields_of,
                                  with_settings)
from batchlab.protocol.setting_groups import (BACKEND_GROUPS, CollectorSettings, SchedulerSettings, TrafficSettings,
                                              WorkerSettings)


BUG_EXIT = 70  # sysexits' EX_SOFTWARE: an exception that is no BatchlabError is a bug in batchlab


class _OneLineErrors(TyperGroup):
    """Every command's BatchlabError becomes `error: <one line>` and exit 1, naming settings by their options (a
    Ctrl-C is typer's: exit 130); any other exception is a bug, shown with its traceback (exit BUG_EXIT); a
    <bool> flag takes true/false (cli.grammar)."""

    def main(self, args=None, *rest, **kwargs):
        """Parse `args` (default: the command line) with bool words read, then run."""
        from batchlab.cli.grammar import bool_words

        args = list(sys.argv[1:] if args is None else args)
        return super().main(bool_words(self, args), *rest, **kwargs)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        """The top level's own options and command name parsed; a usage error is one line (_usage_error). Called
        inside typer's main, which makes a KeyboardInterrupt exit 130: Python's Ctrl-C is given back here, not
        when the module ends (a Ctrl-C between the two was a traceback and a death by SIGINT)."""
        restore_sigint()
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as exc:
            _usage_error(exc)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """A bare `--ray` (no address) means a local Ray (Typer has no option with an optional value)."""
        from batchlab.cli.grammar import with_ray_value

        return super().parse_args(ctx, with_ray_value(args))

    def invoke(self, ctx: click.Context) -> object:
        """Run the command; a BatchlabError is printed as one line, anything else as the bug it is; a reader
        that left (`| head`) or a closed terminal is no error (cli.streams)."""
        from batchlab.cli.streams import readers_may_leave
        from batchlab.protocol.errors import BatchlabError, command_line_vocabulary
        from batchlab.protocol.signals import Terminated, stopped_by, terminated_as_interrupt

        with readers_may_leave(), command_line_vocabulary():
            try:
                with terminated_as_interrupt():
                    return super().invoke(ctx)
            except Terminated as exc:  # a SIGTERM or SIGHUP that no command turned into its own line
                _fail("terminated", code=128 + exc.signum)
            except UsageError as exc:  # a command's options or arguments (parsed inside this invoke)
                _usage_error(exc)
            except (typer.Exit, typer.Abort, click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
                raise
            except Exception as exc:
                # A stop that cut a lazy import short surfaces as another error (a C extension's SystemError, a
                # half-imported module's NameError or AttributeError): it is the stop, not a bug.
                signum = stopped_by() or (signal.SIGINT if _interrupted(exc) else None)
                if signum is not None:
                    _fail("interrupted" if signum == signal.SIGINT else "terminated", code=128 + signum)
                if isinstance(exc, BatchlabError):
                    _fail(exc)
                _bug(exc)


def _bug(exc: Exception) -> NoReturn:
    """An exception no user input explains: its traceback, then one line saying it is batchlab's bug."""
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    line = " ".join(f"{type(exc).__name__}: {exc}".split())
    typer.secho(f"error: a bug in batchlab ({line}); please report it with the traceback above", fg="red", err=True)
    raise typer.Exit(code=BUG_EXIT) from None


def _usage_error(exc: UsageError) -> NoReturn:
    """A bad option, value or argument (`--rate abc`, a missing folder) is bad input like any other: `error: <one
    line>` and exit 1, not click's boxed message and exit 2 (docs/faults.md's codes). A bare command that shows
    its help (no_args_is_help) is left to click."""
    if isinstance(exc, NoArgsIsHelpError):
        raise exc
    path = exc.ctx.command_path if exc.ctx is not None else "batchlab"
    _fail(f"{exc.format_message()} (see '{path} --help')")


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused `exc` (anywhere down its chain of causes)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


app = typer.Typer(cls=_OneLineErrors, add_completion=False, no_args_is_help=True,
                  help="Study how LLM requests should be batched.")
app.add_typer(model_app, name="model")


@app.callback()
def _main(version: Annotated[bool, Opt("--version", is_eager=True, help="print batchlab's version and exit",
                                       callback=show_version)] = False) -> None:
    """Study how LLM requests should be batched."""


def _config(config: str | None, overrides: dict, *, replay: bool = False) -> RunConfig:
    """Defaults ← YAML ← options (with `replay`, a --schedule's own traffic settings); a bad setting is
    one line and exit 1."""
    cfg = checked_config(load_yaml(config) if config else {}, overrides)
    refuse_ignored(cfg)  # --max-concurrency on the sim backend: refused, not recorded as if it applied
    return replay_config(cfg, overrides) if replay and cfg.schedule else cfg


def _fail(error: str | BaseException, code: int = 1) -> NoReturn:
    """`error: <one line>` on stderr and exit `code` (1: bad input)."""
    text = " ".join(str(error).split()) or type(error).__name__
    typer.secho(f"error: {text}", fg="red", err=True)
    raise typer.Exit(code=code) from None


@app.command()
@with_settings(*CLI_FIELDS)
def run(*, overrides: dict, config: ConfigOpt = None, overwrite: Overwrite = False,
        save_result: SaveResult = None, save_detailed: SaveDetailed = False) -> None:
    """Run traffic → scheduler → worker(s) → collector as processes, one command."""
    from batchlab import api
    from batchlab.cli.live import RunStatus
    from batchlab.cli.result_table import show
    from batchlab.runner.outcome import FAULT_EXIT, interrupted_exit, verdict

    out = overrides.pop("out")
    cfg = api.run_config(config or {}, **overrides)  # the live view's settings, checked once: api.run starts them
    status = RunStatus(cfg)
    try:
        with status:
            summary = api.run(cfg, out=out, overwrite=overwrite, on_progress=status,
                              save_result=save_result or None, save_detailed=save_detailed)
    except KeyboardInterrupt as exc:
        _fail(f"interrupted; partial results in {status.folder or out}", code=interrupted_exit(exc))
    except (api.RunFailed, api.RunTimeout) as exc:
        _fail(exc, code=FAULT_EXIT)
    show(summary, str(summary.folder))
    if save_result:  # written by api.run: the figures under vllm bench serve's result keys
        typer.echo(f"vllm-style result: {save_result}")
    code, line = verdict(summary, summary.role_deaths)  # a run that lost requests to a fault (runner/outcome.py)
    if code:
        _fail(line, code=code)


@app.command()
@with_settings(*fields_of(CollectorSettings), "keys")
def collector(*, overrides: dict, address: Annotated[str, Opt(help="bind address (ROUTER)")] = DEFAULT.collector,
              overwrite: Overwrite = False) -> None:
    """Run the collector alone."""
    from batchlab.runner.roles import collector_role
    from batchlab.runner.run_folder import ROLE_FILES, claim

    cfg = _config(None, overrides)
    # one run's tables per folder, never two runs' mixed; the sibling roles' logs may be there first
    claim(cfg.out, overwrite=overwrite, tolerate=ROLE_FILES)
    _role(collector_role, cfg, address)


def _role(role, *args) -> None:
    """Run one role in this process (a known failure: one line and exit 1, as every command's); stopped by
    Ctrl-C, 130."""
    from batchlab.protocol.signals import last_stop_signal

    code = role(*args)
    raise typer.Exit(130 if last_stop_signal() == signal.SIGINT else code or 0)


keys_app = typer.Typer(no_args_is_help=True, help="CurveZMQ keys for non-loopback addresses.")
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(folder: Annotated[str, typer.Argument(help="where to write the key folder")]) -> None:
    """Create server and client key pairs (copy the folder to every host of the run)."""
    from batchlab.protocol.security import generate_keys

    typer.echo(f"keys written to {generate_keys(folder)}")


@app.command()
@with_settings(*fields_of(SchedulerSettings), "max_new_tokens", "workers", "out", "keys")
def scheduler(*, overrides: dict, config: ConfigOpt = None,
              address: Annotated[str, Opt(help="bind address (ROUTER)")] = DEFAULT.scheduler,
              collector: Annotated[str, Opt(help="collector address")] = DEFAULT.collector) -> None:
    """Run the scheduler alone (a new strategy in place of the old)."""
    from batchlab.runner.roles import scheduler_role

    _role(scheduler_role, _config(config, overrides), address, collector)


@app.command()
@with_settings(*fields_of(WorkerSettings, *BACKEND_GROUPS), "strategy", "strategy_args", "batch_size",
               "max_batch_size", "out", "keys")
def worker(*, overrides: dict, config: ConfigOpt = None,
           scheduler: Annotated[str, Opt(help="scheduler address")] = DEFAULT.scheduler,
           collector: Annotated[str, Opt(help="collector address")] = DEFAULT.collector,
           worker_id: Annotated[str, Opt(help="this worker's name")] = "worker-0") -> None:
    """Run one worker alone (e.g. on a remote GPU box)."""
    from batchlab.runner.preflight import check_before_start
    from batchlab.runner.roles import worker_role

    cfg = _config(config, overrides)
    check_before_start(cfg)  # a bad preset or model: one line, before the model loads
    _role(worker_role, cfg, scheduler, collector, worker_id)


@app.command()
@with_settings(*fields_of(TrafficSettings), "model", "out", "keys")
def traffic(*, overrides: dict, config: ConfigOpt = None,
            scheduler: Annotated[str, Opt(help="scheduler address")] = DEFAULT.scheduler) -> None:
    """Run the traffic generator alone."""
    from batchlab.runner.roles import traffic_role

    _role(traffic_role, _config(config, overrides, replay=True), scheduler)


from batchlab.cli import calibrate_cmd, capacity_cmd, tune_cmd, vllm_cmd  # noqa: E402

for _command in (sweep_cmd.sweep, capacity_cmd.capacity, report_cmd.report, simulate_cmd.simulate, tune_cmd.tune,
                 calibrate_cmd.calibrate):
    app.command()(_command)
app.command(context_settings=vllm_cmd.PASSTHROUGH, add_help_option=False)(vllm_cmd.vllm)


def main() -> None:
    """The `batchlab` command (its console script and `python -m batchlab.cli.main`): app(), and once it has
    ended (its exit code chosen, SystemExit on its way out) a late Ctrl-C ends it quietly, as one while it
    imported does, and a Ctrl-C it handled is not taken by Python for an unhandled one (forget_handled_interrupt)."""
    try:
        app()
    except SystemExit:
        forget_handled_interrupt()  # its exit code is the command's answer (130 for a Ctrl-C it stopped on)
        raise
    finally:
        exit_on_sigint_while_importing()


if __name__ == "__main__":
    main()
