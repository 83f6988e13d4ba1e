"""Strategies found by name and resolved once: the policy, the worker mode it needs, the rows a worker runs.

A strategy is a policy class (scheduler.policies.Policy) with class attributes `name`, `mode` ("static"
or "continuous") and, when it takes parameters, `Params`: a dataclass of typed fields with defaults.
`--strategy` names it: a built-in (naive, dynamic, continuous, sjf, edf), the name of a `batchlab.strategies`
entry point, or `package.module:Class`; from Python the class itself may be given (protocol.settings carries
one no other process can import by value). It is built as `Class(params)` (or `Class.from_params(params)`
where the class defines it; `Class()` without Params). A run sets parameters with `strategy_args`
(--strategy-arg KEY=VALUE, or a YAML mapping), typed by the Params field; a parameter named like a run
setting (batch_size, max_batch_size, max_wait_ms, max_new_tokens, ...) takes the run's value when the run's
settings give it explicitly (RunConfig.model_fields_set), else its own default holds. The parameters that
then differ from the run's settings of their names are recorded in the run's strategy_args, so the record
says what ran and a run replayed from its config.yaml runs the same.

Everything that needs the strategy asks `resolve(cfg)`: the scheduler builds its policy, the front end
tells each worker its mode and row cap (a worker never reads the strategy's name), the simulator does
both.
"""
import dataclasses
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.plugins import STRATEGY_GROUP, Registry, from_code
from batchlab.protocol.settings import VLLM, ConfigError, RunConfig, said, vllm_rule
from batchlab.scheduler.ordered import ORDERED
from batchlab.scheduler.policies import BUILTINS as BASIC
from batchlab.scheduler.policies import Capacity, Policy

ENTRY_POINT_GROUP = STRATEGY_GROUP
BUILTINS: dict[str, type] = {**BASIC, **ORDERED}  # naive, dynamic, continuous, sjf, edf
# vllm: continuous (settings.vllm_rule also moves it to the vllm backend)
REGISTRY = Registry("strategy", ENTRY_POINT_GROUP, {**BUILTINS, VLLM: BUILTINS[vllm_rule(VLLM, VLLM)[0]]}, ConfigError)
MODES = tuple(BatchingMode)
REQUIRED = ("name", "mode", "decide", "on_batch_done")
KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
RUN_SETTINGS = frozenset(RunConfig.model_fields) - {"strategy", "strategy_args", "strategy_sha256", "extra"}
FINITE = ConfigDict(allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class Strategy:
    """A resolved strategy: `policy()` builds a fresh policy (one per run)."""

    name: str
    mode: BatchingMode
    rows: int  # the most rows a worker runs at once: its hello's max_batch_size
    args: dict  # the run's strategy_args typed by the strategy's Params, and its own defaults that differ
    build: Callable[[], Policy]

    def policy(self) -> Policy:
        """A new policy object with this run's parameters."""
        return self.build()


def resolve(cfg: RunConfig) -> Strategy:
    """cfg's strategy with cfg's parameters, or ConfigError naming what is wrong."""
    cls = strategy_class(cfg)
    args = typed_args(cls, cfg.strategy_args)

    def build() -> Policy:
        try:
            params = make_params(cls, cfg, args)
            return cls() if params is None else getattr(cls, "from_params", cls)(params)
        except (TypeError, ValueError) as exc:  # the strategy refused its parameters
            raise ConfigError(f"strategy {cls.name}: {exc}") from None
        except Exception as exc:  # a plugin's constructor failed some other way: still one line
            raise ConfigError(f"strategy {cls.name}: building it raised {type(exc).__name__}: {exc}") from None

    policy = build()
    params = make_params(cls, cfg, args)
    rows = getattr(policy, "rows", getattr(params, "max_batch_size", cfg.max_batch_size))
    mode = getattr(policy, "mode", cls.mode)  # a strategy may take its mode as a parameter (sjf, edf)
    if mode not in MODES:
        raise ConfigError(f"strategy {cls.name}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return Strategy(cls.name, BatchingMode(mode), int(rows), {**own_defaults(params, cfg, args), **args}, build)


PROBE_KV_BYTES = 2**40  # the empty-queue probe's KV room: any strategy's first look sees room to spare


def check_decides(strategy: Strategy) -> None:
    """`decide` called once on an empty queue in this process, as the scheduler calls it on its first event:
    anything it raises (a missing decide, a bug) is a ConfigError naming the class, before a process starts."""
    policy = strategy.policy()
    cls = type(policy)
    cap = Capacity(free_slots=strategy.rows, kv_free_bytes=PROBE_KV_BYTES, kv_bytes_per_token=1, idle=True)
    try:
        policy.decide([], 0.0, cap, False)
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"strategy {strategy.name} ({cls.__module__}:{cls.__qualname__}): decide on an empty "
                          f"queue raised {type(exc).__name__}" + (f": {why}" if why else "")) from None


def strategy_class(cfg: RunConfig) -> type:
    """The policy class of a run's settings: the one passed by value (strategy_sha256), else the one its
    strategy names; checked."""
    if not cfg.strategy_sha256:
        return load_class(cfg.strategy)
    code = cfg.strategy_code()
    if not code:
        raise ConfigError(f"strategy {cfg.strategy} ({cfg.strategy_sha256}) was a class passed from Python by "
                          f"value, and these settings do not carry its code: pass the class itself again "
                          f"({said('strategy')}=TheClass)")
    return checked_class(from_code(code), cfg.strategy)


def load_class(spec: str | type) -> type:
    """The policy class `spec` names (built-in, entry point or package.module:Class), or the class given, checked."""
    return checked_class(spec if isinstance(spec, type) else REGISTRY.load(spec), spec)


def checked_class(cls: object, spec: object) -> type:
    """`cls`, when it is a policy class; else ConfigError saying what it lacks."""
    missing = [a for a in REQUIRED if not hasattr(cls, a)]
    if missing or not isinstance(cls, type):
        raise ConfigError(f"strategy {spec} is not a policy class: it lacks {', '.join(missing) or 'a class'} "
                          f"(a strategy is a class with {', '.join(REQUIRED)})")
    if cls.mode not in MODES:
        raise ConfigError(f"strategy {spec}: mode must be one of {', '.join(MODES)}, got {cls.mode!r}")
    return cls


def label(spec: str | type) -> str:
    """A name for folders and tables: a class (given, or named package.module:Class) gives its `name`; others
    are names."""
    if isinstance(spec, type):
        return load_class(spec).name
    if ":" not in spec:
        return spec
    try:
        return load_class(spec).name
    except ConfigError:  # the point fails on its own when it runs
        return spec.rpartition(":")[2]


def names() -> list[str]:
    """Every strategy `--strategy NAME` accepts (vllm: continuous on the vllm backend)."""
    return REGISTRY.names()


def typed_args(cls: type, given: dict) -> dict:
    """`given` (strategy_args) checked against cls.Params: known keys, values of the fields' types."""
    kind = getattr(cls, "Params", None)
    if kind is None:
        if given:
            raise ConfigError(f"strategy {cls.name} takes no parameters, got {', '.join(given)}")
        return {}
    if not dataclasses.is_dataclass(kind):
        raise ConfigError(f"strategy {cls.name}: its Params must be a dataclass")
    fields = [f.name for f in dataclasses.fields(kind) if f.init]
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ConfigError(f"strategy {cls.name} has no parameter {', '.join(unknown)} "
                          f"(parameters: {', '.join(fields) or 'none'})")
    hints = typing.get_type_hints(kind)
    return {k: _typed(cls.name, k, v, hints.get(k)) for k, v in given.items()}


def make_params(cls: type, cfg: RunConfig, args: dict) -> object | None:
    """cls.Params from `args` (typed) over the run's same-named settings that were given explicitly (the others
    keep the Params' own defaults); None when cls has none."""
    kind = getattr(cls, "Params", None)
    if kind is None:
        return None
    given = [f.name for f in dataclasses.fields(kind) if f.init and f.name in RUN_SETTINGS & cfg.model_fields_set]
    return kind(**{**{k: getattr(cfg, k) for k in given}, **args})


def own_defaults(params: object | None, cfg: RunConfig, args: dict) -> dict:
    """The parameters named like a run setting whose value (the Params' own default) differs from the run's
    setting of that name: recorded beside `args`, so the run's record says what ran."""
    if params is None:
        return {}
    names = [f.name for f in dataclasses.fields(params) if f.init and f.name in RUN_SETTINGS and f.name not in args]
    return {k: getattr(params, k) for k in names if getattr(params, k) != getattr(cfg, k)}


def _typed(strategy: str, key: str, value: object, kind: object) -> object:
    """`value` as the parameter's type, or ConfigError naming it: a number, flag or text is checked by pydantic
    (strictly, but text from --strategy-arg is parsed: '8', '0.5', 'true'); another class by isinstance; a
    hint that is no class (a generic, Any) passes."""
    if kind not in KIND_NAMES:
        if isinstance(kind, (type, types.UnionType)) and not isinstance(value, kind):
            raise ConfigError(f"strategy {strategy}: parameter {key} must be {getattr(kind, '__name__', kind)}, "
                              f"got {value!r}")
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # numpy ints too
        value = int(value)
    bounded = Annotated[kind, Field(gt=-2**63, lt=2**63)] if kind in (int, float) else kind
    try:
        return TypeAdapter(bounded, config=FINITE).validate_python(value, strict=not isinstance(value, str))
    except ValidationError as exc:
        typed = exc.errors()[0]["type"].endswith(("_type", "_parsing"))
        what = KIND_NAMES[kind] if typed else "a finite number below 2**63"
        raise ConfigError(f"strategy {strategy}: parameter {key} must be {what}, got {value!r}") from None
