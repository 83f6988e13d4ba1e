"""One run's settings: defaults, then a YAML file, then command-line options; validated once.

The project's shared vocabulary, at the bottom of the layers: every package may read a RunConfig, none
needs the front end (`cli`) for it. RunConfig composes the groups of protocol.setting_groups, where every
field is declared once; pydantic checks them, and its errors become one ConfigError line. Which strategy
names exist is the scheduler's business (`scheduler.strategies.resolve`), checked where the front end
composes a run. Merging the layers also settles how the load stops and is paced beside the rate: a
count-only stop's duration (count_duration_s) and the closed loop's terms (closed_loop_terms).
"""
import difflib
import math
from pathlib import Path

import yaml
from pydantic import BaseModel, PrivateAttr, ValidationError, model_validator

from batchlab.protocol.plugins import class_digest, class_spec
from batchlab.protocol.setting_groups import (BACKENDS, CLOSED_LOOP_COUNT_DURATION_S, DEFAULT_DURATION_S,  # noqa: F401
                                              DEFAULT_RATE, GROUPS, ConfigError, HFBackendSettings,
                                              OpenAIBackendSettings, ScheduleSettings, VLLMBackendSettings,
                                              closed_loop_conflict, flag_of, parse_bytes, parse_slos, refuse, said,
                                              slo_items)

# The settings a schedule is built from: a replayed schedule brings its own.
TRAFFIC_FIELDS = tuple(ScheduleSettings.model_fields)
VLLM = "vllm"  # a strategy name and a backend name


def vllm_rule(strategy: str, backend: str) -> tuple[str, str, str]:
    """(strategy, backend, label) of a run: strategy vllm is continuous batching on the vllm backend, and a run
    on the vllm backend counts as strategy vllm whatever the scheduler runs (vLLM's engine does the batching)."""
    if strategy == VLLM:
        strategy, backend = "continuous", VLLM
    return strategy, backend, VLLM if backend == VLLM else strategy


class RunConfig(*GROUPS, title="RunConfig"):
    """Everything that defines a run (written into every table and summary). `model_fields_set` says which
    settings were given (a file, an option, a mapping): a strategy's own parameter defaults hold for the rest."""

    _strategy_code: bytes = PrivateAttr(b"")  # a strategy class passed by value (strategy_sha256 names it)
    _checked_as: dict | None = PrivateAttr(None)  # its settings when the front end's check passed them

    def __init__(self, **values: object) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise config_error(exc) from None

    @model_validator(mode="wrap")
    @classmethod
    def _strategy_object(cls, values: object, handler) -> "RunConfig":
        """A strategy given as a class: named module:Class (its label: the class's `name`), its code carried by
        value when no other process can import that name (protocol.plugins.class_spec)."""
        strategy = values.get("strategy") if isinstance(values, dict) else None
        if not isinstance(strategy, type):
            return handler(values)
        spec, code = class_spec(strategy)
        label = values.get("label") or getattr(strategy, "name", "") or strategy.__name__
        model = handler({**values, "strategy": spec, "strategy_sha256": class_digest(strategy) if code else "",
                         "label": label})
        model._strategy_code = code
        return model

    def strategy_code(self) -> bytes:
        """The pickled strategy class when one was passed by value (strategy_sha256 set), else b""."""
        return self._strategy_code

    @model_validator(mode="after")
    def _across_groups(self) -> "RunConfig":
        """The rules that span groups; strategy vllm means continuous batching in the vllm backend."""
        if self.backend == "openai" and not self.endpoint:
            raise refuse(f"{said('backend', 'openai')} needs {said('endpoint', meta='URL')}")
        self.strategy, self.backend, _ = vllm_rule(self.strategy, self.backend)
        return self

    def mark_checked(self) -> "RunConfig":
        """Note that the whole check (runner.preflight.checked_config) passed these settings as they are now."""
        self._checked_as = self.model_dump()
        return self

    def checked(self) -> bool:
        """Whether the whole check passed these settings and none changed since (no second check needed)."""
        return self._checked_as is not None and self._checked_as == self.model_dump()

    def validate(self) -> "RunConfig":
        """Check every setting again (after edits in place); ConfigError on the first impossible one."""
        self.__dict__.update(type(self)(**self.model_dump()).__dict__)
        return self

    def slos(self) -> dict[str, float]:
        """The SLOs in seconds ({} when none); ConfigError on a bad one."""
        try:
            return parse_slos(self.slo)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def as_settings(self) -> dict:
        """Flat dict for RunInfo and reports."""
        d = self.model_dump()
        d.update(d.pop("extra"))
        return d


# a built-in backend's own settings, which every other built-in backend ignores (the sim backend's preset is
# not among them: `simulate` and `calibrate` read it beside live runs; speed_noise likewise)
BACKEND_ONLY = {"openai": tuple(OpenAIBackendSettings.model_fields), "vllm": tuple(VLLMBackendSettings.model_fields),
                "hf": tuple(HFBackendSettings.model_fields)}
SHARED_ONLY = {"cpu_threads": ("hf", "vllm")}  # a worker setting that only these backends read


def refuse_ignored(cfg: RunConfig) -> None:
    """ConfigError naming the settings given for this run (cfg.model_fields_set: the file's and the command
    line's) that its backend ignores: another built-in backend's own. A plugin backend may read any setting."""
    if cfg.backend not in BACKENDS:
        return
    ignored = [(said(name), backend) for backend, names in BACKEND_ONLY.items() if backend != cfg.backend
               for name in names if name in cfg.model_fields_set]
    ignored += [(said(name), " and ".join(backends)) for name, backends in SHARED_ONLY.items()
                if cfg.backend not in backends and name in cfg.model_fields_set]
    if ignored:
        named = ", ".join(f"{option} (the {backend} backend's)" for option, backend in ignored)
        raise ConfigError(f"backend {cfg.backend} ignores {named}: leave {'them' if len(ignored) > 1 else 'it'} "
                          "out rather than record a setting that does not apply")


def config_error(exc: ValidationError, schema: type[BaseModel] | None = None) -> ConfigError:
    """pydantic's errors as the one line a user reads: the option, its bound and unit, what was given
    (`schema`: the settings that were checked, default RunConfig)."""
    schema = schema or RunConfig
    errors = exc.errors(include_url=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        close = sorted({m for n in unknown for m in difflib.get_close_matches(n, schema.model_fields, n=2)})
        return ConfigError(f"unknown setting(s): {', '.join(unknown)}" + (f" (did you mean {', '.join(close)}?)"
                                                                          if close else ""))
    return ConfigError(_said(errors[0], schema))


def checked_group(schema: type[BaseModel], values: dict) -> BaseModel:
    """A settings group from the values given (None: not given, its default stands), or ConfigError's line."""
    try:
        return schema(**{k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise config_error(exc, schema) from None


def _said(error: dict, schema: type[BaseModel]) -> str:
    """One pydantic error in words."""
    name, kind, value, ctx = str((*error["loc"], "")[0]), error["type"], error.get("input"), error.get("ctx") or {}
    field = schema.model_fields.get(name)
    extra, option = (field.json_schema_extra or {}) if field else {}, said(name, schema=schema)
    bound = next((b for b in ("gt", "ge", "lt", "le") if b in ctx), None)
    if kind in ("config", "value_error"):  # a rule's own line; a parser's (sizes, SLOs)
        return str(ctx.get("error", error["msg"]))
    if kind == "finite_number":
        return f"{option} must be a finite number, got {value}"
    if bound and ctx[bound] == 2**63:
        return f"{option} {value} is out of range (at most 2**63 - 1)"
    if bound:
        limit = f"{ctx[bound]:g}" if isinstance(ctx[bound], float) else ctx[bound]
        words = (f"{option} must be {_SIGNS[bound]} {limit}", extra.get("unit"), extra.get("note"))
        return " ".join(p for p in words if p) + f", got {value!r}"
    if kind == "string_pattern_mismatch":  # a name that is empty
        return f"{option} must name {extra.get('note')}"
    if kind == "literal_error":
        return f"{option} must be one of {', '.join(field.annotation.__args__)}, got {value!r}"
    what = "token lengths (e.g. 128, 32-512)" if len(error["loc"]) > 1 else _KIND_NAMES.get(kind, error["msg"])
    return f"setting {name} must be {what}, got {value!r} ({type(value).__name__})"


_SIGNS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
_KIND_NAMES = {"bool_type": "true or false", "int_type": "an integer", "float_type": "a number",
               "string_type": "a string", "dict_type": "a mapping", "list_type": "a list"}


def option_name(name: str, schema: type[BaseModel] | None = None) -> str:
    """The command-line option of <schema, default RunConfig>.<name> (its declared flag, else
    --name-with-dashes): what cli.options generates; a message names a setting with `said`."""
    return flag_of(name, schema or RunConfig)


def load_yaml(path: str | Path) -> dict:
    """A YAML mapping of RunConfig fields (dashes or underscores), or ConfigError."""
    if Path(path).is_dir():
        raise ConfigError(f"config file {path} is a folder, not a YAML file")
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:  # no permission, a device, bytes that are no text
        raise ConfigError(f"config file {path} cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build_config(file_values: dict, overrides: dict) -> RunConfig:
    """Defaults ← file ← command line (only options the user gave), validated; None means not given."""
    refuse_no_clients(overrides)
    merged = {k: v for values in (file_values, overrides) for k, v in values.items() if v is not None}
    args = [values.get("strategy_args") for values in (file_values, overrides)]
    if any(a is not None for a in args):  # the command line's parameters are laid over the file's, key by key
        merged["strategy_args"] = {k: v for a in args if a is not None for k, v in parse_strategy_args(a).items()}
    if merged.get("arrival") == "trace" and "rate" not in merged:
        merged["rate"] = 0.0  # a trace keeps its own timing unless a rate is asked for
    if "slo" in merged and isinstance(merged["slo"], (str, list, tuple)):  # comma lists: one item per SLO
        merged["slo"] = slo_items(merged["slo"])
    if merged.get("concurrency") and not closed_loop_terms(merged):
        raise ConfigError(closed_loop_conflict())
    if merged.get("num_requests") and "duration_s" not in merged:  # the count alone stops the run
        merged["duration_s"] = count_duration_s(merged["num_requests"], merged.get("rate", DEFAULT_RATE),
                                                merged.get("burstiness", 1.0))
    return RunConfig(**merged)


def refuse_no_clients(overrides: dict) -> None:
    """ConfigError for a client count given as an option or a change below 1: 0 means open loop only as a file's
    value or the default, never as a count asked for."""
    given = overrides.get("concurrency")
    if isinstance(given, (int, float)) and not isinstance(given, bool) and given < 1:
        raise ConfigError(f"{said('concurrency')} must be ≥ 1 client (leave it out for open-loop {said('rate')})")


def closed_loop_terms(merged: dict) -> bool:
    """Closed loop decides send times online, so a rate or an arrival process beside it is refused (False);
    else the merged settings get rate inf (no planned times: every request is ready at t = 0, the clients
    take them in order) and, for --num-requests alone, a duration that leaves the count to stop the run."""
    rate, arrival = merged.get("rate"), merged.get("arrival", "poisson")
    rate_inf = rate is None or str(rate).strip().lower() in ("inf", "+inf", "infinity")
    if not rate_inf or arrival != "poisson":
        return False
    merged["rate"] = math.inf
    if merged.get("num_requests") and "duration_s" not in merged:
        merged["duration_s"] = CLOSED_LOOP_COUNT_DURATION_S
    return True


def count_duration_s(num_requests: object, rate: object, burstiness: object) -> float:
    """A duration that holds `num_requests` arrivals at `rate` all but surely (their mean time plus 8
    standard deviations of a gamma process, s): --num-requests without --duration is a count-only stop.
    rate inf (all at t = 0) or a rate that is no number: the default duration (DEFAULT_DURATION_S)."""
    try:
        n, rate_f, shape = float(num_requests), float(rate), min(float(burstiness), 1.0)
        if not (rate_f > 0 and math.isfinite(rate_f) and n > 0 and shape > 0):
            return DEFAULT_DURATION_S
        return float(f"{(n + 8 * math.sqrt(n / shape) + 1) / rate_f:.4g}")
    except (TypeError, ValueError):
        return DEFAULT_DURATION_S


def parse_strategy_args(given: object) -> dict:
    """A mapping (YAML) or ['KEY=VALUE', ...] (--strategy-arg) → {key: value}; values stay as given (the
    strategy types them by its parameters); ConfigError on an item that is neither."""
    if isinstance(given, dict):
        return {str(k).replace("-", "_"): v for k, v in given.items()}
    if not isinstance(given, (list, tuple)):
        raise ConfigError(f"setting strategy_args must be a mapping, got {given!r}")
    pairs = {}
    for item in given:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{said('strategy_args')} {item!r}: expected KEY=VALUE")
        pairs[key.strip().replace("-", "_")] = value.strip()
    return pairs
