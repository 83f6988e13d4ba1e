"""One settings grammar on every command: a flag shown as <bool> takes true/false too, --version, and the
fan-out options (--processes; --ray, whose ADDRESS may be left out).

Typer makes a bool option a bare flag; `--strict-memory true` (as a user writes it after seeing <bool>)
would be an unexpected argument. Before parsing, `--flag WORD` and `--flag=WORD` become the flag or its
`--no-` form; any other use of the flag is left as it is.
"""
from importlib import metadata
from typing import Annotated, Optional

import typer

TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _bool_flags(command) -> dict[str, tuple[str, str | None]]:
    """Each bool flag's spelling → (its true form, its false form or None)."""
    flags = {}
    for param in command.params:
        # typer may carry its own copy of click: an option is known by its flag attributes, not its class
        if getattr(param, "is_flag", False) and getattr(param, "is_bool_flag", False) and param.opts:
            on, off = param.opts[0], (param.secondary_opts or [None])[0]
            flags.update({opt: (on, off) for opt in param.opts})
            flags.update({opt: (off, on) for opt in param.secondary_opts})
    return flags


def _word(text: str) -> bool | None:
    low = text.strip().lower()
    return True if low in TRUE else False if low in FALSE else None


def bool_words(group, args: list[str]) -> list[str]:
    """`args` with `--flag true|false` (yes/no, on/off, 1/0; also `--flag=WORD`) of the subcommand's bool
    flags written as the flag or its negative; a false flag with no negative is dropped (not given)."""
    name = next((a for a in args if not a.startswith("-")), None)
    command = group.commands.get(name) if name else None
    flags = _bool_flags(command) if command is not None else {}
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        flag, eq, given = arg.partition("=")
        value = _word(given) if eq else _word(args[i + 1]) if flag in flags and i + 1 < len(args) else None
        if flag not in flags or value is None:
            out.append(arg)
            i += 1
            continue
        chosen = flags[flag][0] if value else flags[flag][1]
        out += [chosen] if chosen else []
        i += 1 if eq else 2
    return out


def version() -> str:
    """The installed batchlab's version."""
    try:
        return metadata.version("batchlab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def show_version(value: bool) -> None:
    """--version: print it and exit."""
    if value:
        typer.echo(f"batchlab {version()}")
        raise typer.Exit()


def ray_option(*names: str, help: str):
    """`--ray [ADDRESS]`: left without a value, it reads "local" (main fills it in: with_ray_value)."""
    return typer.Option(*names, metavar="[ADDRESS]", help=help)


def with_ray_value(args: list[str]) -> list[str]:
    """Command-line words with "local" after a `--ray` that has no value (last, or before an option)."""
    out = []
    for k, word in enumerate(args):
        out.append(word)
        if word == "--ray" and (k + 1 == len(args) or args[k + 1].startswith("-")):
            out.append("local")
    return out


Processes = Annotated[int, typer.Option("--processes", help="local processes to evaluate in (0: one per core; "
                                                           "1: in this process)")]
RayAddress = Annotated[Optional[str], ray_option(
    "--ray", help="evaluate on a Ray cluster (ADDRESS as RAY_ADDRESS; alone: a local Ray); see docs/ray.md")]
