"""Command-line options generated from the settings' declarations (protocol.setting_groups for a run's,
protocol.study_settings for a capacity search's and calibrate's), so a field's flag, help text, unit, shown
default and --help panel are written once.

A flag shown as <bool> also takes a value (`--strict-memory true`, cli.grammar). A setting's option defaults
to None, meaning "not given" (a YAML file's value or the field's default then stands); its help shows the
field's default. A field's former spelling (`old_flag`) still works, hidden from --help, with a warning.
"""
import functools
import inspect
import typing
from typing import Annotated, Optional

import typer
from pydantic import BaseModel

from batchlab.protocol.settings import RunConfig, option_name

Opt = typer.Option
FIELDS = RunConfig.model_fields
CLI_FIELDS = tuple(n for n, f in FIELDS.items() if not (f.json_schema_extra or {}).get("no_option"))


def shown_default(name: str, schema: type[BaseModel] = RunConfig) -> str | bool:
    """The field's default as --help shows it (False: nothing to show, e.g. '' or {})."""
    field = schema.model_fields[name]
    if (field.json_schema_extra or {}).get("hide_default"):
        return False
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if value or isinstance(value, (int, float)) else False


def panel(name: str, schema: type[BaseModel] = RunConfig) -> str:
    """The --help panel of a field: its group's title."""
    owner = next(c for c in schema.__mro__ if name in c.__dict__.get("__annotations__", {}))
    return owner.model_config["title"]


def option(name: str, kind: type | None = None, *, schema: type[BaseModel] = RunConfig, **changes: object) -> object:
    """The option type of <schema>.<name> (`kind`, `changes`: its type and typer.Option arguments where they
    differ)."""
    field = schema.model_fields[name]
    extra, given = field.json_schema_extra or {}, field.annotation
    kind = kind or (list[str] if given in (dict, list) else given if given in (bool, int, float) else str)
    flag = option_name(name, schema)
    decls = (f"{flag}/--no-{flag[2:]}",) if kind is bool else (flag,)
    unit = extra.get("unit")
    info = {"help": f"{field.description} ({unit})" if unit else field.description,
            "show_default": shown_default(name, schema), "rich_help_panel": panel(name, schema), **changes}
    return Annotated[Optional[kind], Opt(*decls, **info)]


def _old_spellings(names: tuple[str, ...], schema: type[BaseModel]) -> dict[str, str]:
    """name → its former flag, for the fields that declare one."""
    extras = {n: schema.model_fields[n].json_schema_extra or {} for n in names}
    return {n: e["old_flag"] for n, e in extras.items() if e.get("old_flag")}


def _old_option(name: str, flag: str, schema: type[BaseModel]) -> object:
    """A hidden option for a field's former spelling (same type, no default shown)."""
    kind = next(iter(typing.get_args(option(name, schema=schema))))
    return Annotated[kind, Opt(flag, hidden=True)]


def _take_old(given: dict, old: dict[str, str], schema: type[BaseModel]) -> None:
    """A former spelling's value into its field (the current spelling wins when both are given), warned about."""
    for name, flag in old.items():
        value = given.pop(f"{name}__old")
        if value is not None:
            typer.secho(f"warning: {flag} is deprecated; use {option_name(name, schema)}", fg="yellow", err=True)
            given[name] = value if given[name] is None else given[name]


def fields_of(*groups: type[BaseModel]) -> tuple[str, ...]:
    """The command-line fields of these groups, in declaration order."""
    return tuple(n for g in groups for n in g.model_fields if n in CLI_FIELDS)


def with_settings(*names: str, custom: dict | None = None, schema: type[BaseModel] = RunConfig,
                  into: str = "overrides"):
    """Give a command these settings' options (fields of `schema`, after its own options), handed to it as
    `<into>={name: value or None}`; `custom` holds an option type for a name whose option differs in this
    command."""
    names = tuple(dict.fromkeys(names))
    old = _old_spellings(names, schema)

    def wrap(command):
        own = [p for p in inspect.signature(command).parameters.values() if p.name != into]
        made = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=(custom or {}).get(n) or option(n, schema=schema)) for n in names]
        made += [inspect.Parameter(f"{n}__old", inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=_old_option(n, flag, schema)) for n, flag in old.items()]

        @functools.wraps(command)
        def run(**given: object) -> object:
            _take_old(given, old, schema)
            return command(**{into: {n: given.pop(n) for n in names}}, **given)

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
# a sweep YAML's entries may run on several backends, each kind playing its own step model (lab.simulate)
PRESET_PER_KIND = option("preset", help=FIELDS["preset"].description + "; a grid on several backends takes one "
                         "per backend kind: hf=PRESET,hf-loop=PRESET,vllm=PRESET (hf-loop: hf with a continuous "
                         "strategy)")
