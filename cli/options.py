"""Command-line options generated from the settings' declarations (protocol.setting_groups), so a field's
flag, help text, unit, shown default and --help panel are written once.

A flag shown as <bool> also takes a value (`--strict-memory true`, cli.grammar). A run setting's option
defaults to None, meaning "not given" (a YAML file's value then stands); its help shows RunConfig's default.
"""
import functools
import inspect
from typing import Annotated, Optional

import typer
from pydantic import BaseModel

from batchlab.protocol.settings import RunConfig, option_name

Opt = typer.Option
FIELDS = RunConfig.model_fields
CLI_FIELDS = tuple(n for n, f in FIELDS.items() if not (f.json_schema_extra or {}).get("no_option"))


def shown_default(name: str) -> str | bool:
    """RunConfig's default for `name` as --help shows it (False: nothing to show, e.g. '' or {})."""
    field = FIELDS[name]
    if (field.json_schema_extra or {}).get("hide_default"):
        return False
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value or isinstance(value, (int, float)) else False


def panel(name: str) -> str:
    """The --help panel of a field: its group's title."""
    owner = next(c for c in RunConfig.__mro__ if name in c.__dict__.get("__annotations__", {}))
    return owner.model_config["title"]


def option(name: str, kind: type | None = None, **changes: object) -> object:
    """The option type of RunConfig.<name> (`kind`, `changes`: its type and typer.Option arguments where they
    differ)."""
    field = FIELDS[name]
    extra, given = field.json_schema_extra or {}, field.annotation
    kind = kind or (list[str] if given in (dict, list) else given if given in (bool, int, float) else str)
    flag = option_name(name)
    decls = (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag,)
    unit = extra.get("unit")
    info = {"help": f"{field.description} ({unit})" if unit else field.description,
            "show_default": shown_default(name), "rich_help_panel": panel(name), **changes}
    return Annotated[Optional[kind], Opt(*decls, **info)]


def fields_of(*groups: type[BaseModel]) -> tuple[str, ...]:
    """The command-line fields of these groups, in declaration order."""
    return tuple(n for g in groups for n in g.model_fields if n in CLI_FIELDS)


def with_settings(*names: str, custom: dict | None = None):
    """Give a command these settings' options (after its own), handed to it as `overrides={name: value or
    None}`; `custom` holds an option type for a name whose option differs in this command."""
    names = tuple(dict.fromkeys(names))

    def wrap(command):
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "overrides"]
        made = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=(custom or {}).get(n) or option(n)) for n in names]

        @functools.wraps(command)
        def run(**given: object) -> object:
            return command(overrides={n: given.pop(n) for n in names}, **given)

        run.__signature__ = inspect.Signature(own + made)
        run.__annotations__ = {p.name: p.annotation for p in own + made}
        return run
    return wrap


ConfigOpt = Annotated[Optional[str], Opt("--config", help="YAML file of settings (options override it)")]
Overwrite = Annotated[bool, Opt("--overwrite", help="replace what --out holds (else a used folder is refused)")]
SLO_HELP = FIELDS["slo"].description
SaveResult = Annotated[Optional[str], Opt(
    "--save-result", help="also write the run's figures to this JSON file under vllm bench serve's result keys "
                          "and units (docs/load-and-results.md)")]
SaveDetailed = Annotated[bool, Opt("--save-detailed", help="with --save-result: also each request's lengths, TTFT, "
                                                           "token gaps and start time (vLLM's --save-detailed lists)")]
