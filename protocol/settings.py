"""One run's settings: defaults, then a YAML file, then command-line options; validated once.

The project's shared vocabulary, at the bottom of the layers: every package may read a RunConfig, none
needs the front end (`cli`) for it. Which strategy names exist is the scheduler's business
(`scheduler.strategies.resolve`), checked where the front end composes a run.
"""
import math
import numbers
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from batchlab.protocol.load_stops import (CLOSED_LOOP_CONFLICT, DEFAULT_DURATION_S, closed_loop_terms,  # noqa: F401
                                         count_duration_s)
from batchlab.protocol.plugins import BACKEND_GROUP, entry_point_names
from batchlab.protocol.slos import SLO_NAMES, UNITS_S, parse_slos, slo_items  # noqa: F401 (re-exported)

BACKENDS = ("sim", "echo", "hf", "vllm", "openai")
ARRIVALS = ("poisson", "gamma", "constant", "trace")
# The settings a schedule is built from: a replayed schedule brings its own.
TRAFFIC_FIELDS = ("arrival", "rate", "duration_s", "burstiness", "seed", "dataset", "max_new_tokens",
                  "max_prompt_len", "trace_start_s", "prompt_lengths", "output_lengths", "num_requests")
DEFAULT_RATE = 10.0  # requests/s
Lengths = str | int | list | dict  # 128, "32-512", "64,128,256", [64, 128], "lognormal:mean=256", {dist: ...}


class ConfigError(ValueError):
    """A setting that cannot work; the CLI prints it as one line and exits 1."""


@dataclass(slots=True)
class RunConfig:
    """Everything that defines a run (written into every table and summary)."""

    strategy: str = "dynamic"  # a built-in, an entry point's name, or package.module:Class
    strategy_args: dict = field(default_factory=dict)  # the strategy's parameters (scheduler.strategies)
    backend: str = "sim"
    model: str = "tiny-mistral"
    preset: str = "a100-llama2-7b"  # sim backend step-time preset
    rate: float = DEFAULT_RATE  # requests/s; inf: every request at t = 0 (needs num_requests)
    duration_s: float = DEFAULT_DURATION_S
    num_requests: int = 0  # stop after this many requests or duration_s, whichever comes first; 0: duration only
    arrival: str = "poisson"
    concurrency: int = 0  # closed loop: this many clients, each sends when its last request ended; 0: open loop
    think_time_ms: float = 0.0  # closed loop: a client waits this long after an end before its next send
    burstiness: float = 1.0
    dataset: str = "sharegpt"  # sharegpt | synthetic | azure-conv | azure-code | trace:PATH | PATH
    trace_start_s: float = 0.0  # traces: where in the trace the run starts, s after its first request
    prompt_lengths: Lengths = ""  # synthetic prompts' lengths (traffic.lengths); "": uniform 32-512
    output_lengths: Lengths = ""  # synthetic requests' output lengths; "": uniform 16-256
    schedule: str = ""  # replay a saved schedule.parquet instead of generating one
    batch_size: int = 8  # naive: exactly N
    max_batch_size: int = 16  # dynamic cap / worker rows
    max_wait_ms: float = 50.0
    max_new_tokens: int = 128
    max_prompt_len: int = 1024
    seed: int = 0
    label: str = ""  # the run's name in a sweep (its strategy entry's label; "": the strategy's); not identity
    repeat: int = 0  # which repeat of its sweep point the run is (its seed is the grid's seed + repeat)
    out: str = "runs/latest"
    workers: int = 1
    max_queue: int = 0  # requests; 0: unbounded
    max_queue_tokens: int = 0  # prompt + output tokens queued; 0: unbounded
    liveness_s: float = 30.0  # a worker, the traffic or the scheduler silent this long is declared dead
    stall_limit_s: float = 60.0  # stream ended, requests queued, every worker idle this long: stalled; 0: off
    memory_budget: str = ""  # KV budget, e.g. "2GiB"; default: the backend's own
    strict_memory: bool = False
    dtype: str = "auto"
    device: str = "auto"
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    enforce_eager: bool = False
    torch_compile: bool = False  # hf static: a fixed-shape decode compiled by torch.compile (CUDA graphs on CUDA)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    endpoint: str = ""
    max_concurrency: int = 64
    warmup_requests: int = 2
    keys: str = ""  # CurveZMQ key folder (required to bind a non-loopback address)
    slo: list = field(default_factory=list)  # e.g. ["ttft=500ms", "tpot=50ms"]: goodput in summary.json
    extra: dict = field(default_factory=dict)

    def validate(self) -> "RunConfig":
        """Raise ConfigError on the first impossible setting."""
        _check_numbers(self)
        checks = [
            (bool(self.strategy), "--strategy must name a strategy"),
            (self.backend in BACKENDS or ":" in self.backend or self.backend in entry_point_names(BACKEND_GROUP),
             f"--backend must be one of {', '.join(BACKENDS)}, a {BACKEND_GROUP} entry point or package.module:Class"),
            (self.arrival in ARRIVALS, f"--arrival must be one of {', '.join(ARRIVALS)}"),
            (self.rate > 0 or (self.rate == 0 and self.arrival == "trace"),
             "--rate must be > 0 requests/s (0 only with --arrival trace: the trace's own rate)"),
            (self.trace_start_s >= 0, "--trace-start must be ≥ 0 s"),
            (self.duration_s > 0 and math.isfinite(self.duration_s), "--duration must be > 0 s"),
            (self.num_requests >= 0, "--num-requests must be ≥ 0 (0: --duration alone stops the run)"),
            (self.concurrency >= 0, "--concurrency must be ≥ 1 client (0: open loop, --rate)"),
            (math.isfinite(self.rate) or self.num_requests > 0 or self.concurrency > 0,
             "--rate inf (every request at t = 0) needs --num-requests N"),
            (self.think_time_ms >= 0, "--think-time-ms must be ≥ 0 ms"),
            (self.concurrency == 0 or math.isinf(self.rate), CLOSED_LOOP_CONFLICT),
            (math.isfinite(self.rate) or self.arrival != "trace", "--rate inf does not go with --arrival trace"),
            (self.burstiness > 0, "--burstiness must be > 0"),
            (self.batch_size >= 1, "--batch-size must be ≥ 1"),
            (self.max_batch_size >= 1, "--max-batch-size must be ≥ 1"),
            (self.max_wait_ms >= 0, "--max-wait-ms must be ≥ 0"),
            (self.max_new_tokens >= 1, "--max-new-tokens must be ≥ 1"),
            (self.workers >= 1, "--workers must be ≥ 1"),
            (self.batch_size <= MAX_ROWS and self.max_batch_size <= MAX_ROWS,
             f"--batch-size and --max-batch-size must be ≤ {MAX_ROWS} (the most rows one message holds)"),
            (self.max_prompt_len >= 1, "--max-prompt-len must be ≥ 1"),
            (self.max_queue >= 0, "--max-queue must be ≥ 0 requests (0: unbounded)"),
            (self.max_queue_tokens >= 0, "--max-queue-tokens must be ≥ 0 (0: unbounded)"),
            (self.seed >= 0, "--seed must be ≥ 0"),
            (self.repeat >= 0, "repeat must be ≥ 0"),
            (self.warmup_requests >= 0, "--warmup-requests must be ≥ 0"),
            (self.max_concurrency >= 1, "--max-concurrency must be ≥ 1"),
            (self.max_num_seqs >= 0 and self.max_num_batched_tokens >= 0,
             "--max-num-seqs and --max-num-batched-tokens must be ≥ 0 (0: the engine's default)"),
            (self.tensor_parallel_size >= 1 and self.pipeline_parallel_size >= 1,
             "--tensor-parallel-size and --pipeline-parallel-size must be ≥ 1"),
            (0 < self.gpu_memory_utilization <= 1, "--gpu-memory-utilization must be in (0, 1]"),
            (bool(str(self.out).strip()), "--out must name a folder (it is empty)"),
            (self.backend != "openai" or bool(self.endpoint), "--backend openai needs --endpoint URL"),
        ]
        checks += self._fault_checks()
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.strategy == "vllm":
            self.strategy, self.backend = "continuous", "vllm"
        parse_bytes(self.memory_budget)
        self.slos()
        return self

    def _fault_checks(self) -> list[tuple[bool, str]]:
        """The liveness window and the stall limit (NaN fails every comparison, so it is refused)."""
        return [(0 < self.liveness_s < float("inf"), "liveness_s must be a number of seconds > 0"),
                (0 <= self.stall_limit_s < float("inf"), "stall_limit_s must be ≥ 0 s (0: no limit)")]

    def slos(self) -> dict[str, float]:
        """The SLOs in seconds ({} when none); ConfigError on a bad one."""
        try:
            return parse_slos(self.slo)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def as_settings(self) -> dict:
        """Flat dict for RunInfo and reports."""
        d = asdict(self)
        d.update(d.pop("extra"))
        return d


def parse_bytes(text: str) -> int:
    """'2GiB', '512MB', '1e9' → bytes; '' → 0 (meaning: the backend's default)."""
    if not text:
        return 0
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}
    t = str(text).strip().lower()
    for unit, scale in units.items():
        if t.endswith(unit):
            t, mult = t[: -len(unit)], scale
            break
    else:
        mult = 1
    try:
        number = float(t) * mult
    except ValueError:
        raise ConfigError(f"cannot read {text!r} as a size (e.g. 2GiB, 512MB)") from None
    if not math.isfinite(number) or number >= 2**63:
        raise ConfigError(f"size {text!r} must be a finite number of bytes below 2**63 (e.g. 2GiB, 512MB)")
    value = int(number)
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


MAX_ROWS = 1 << 20  # a message's longest list (protocol.codec.MAX_ARRAY_LEN): a batch of more cannot be sent
OPTION_NAMES = {"duration_s": "--duration", "trace_start_s": "--trace-start"}


def _check_numbers(cfg: RunConfig) -> None:
    """ConfigError for the first number setting that is NaN, infinite, or an int outside int64."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if type(value) is bool or not isinstance(value, (int, float)):
            continue
        option = OPTION_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        if f.name == "rate" and value == math.inf:  # every request at t = 0: validate() checks its terms
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{option} must be a finite number, got {value}")
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            raise ConfigError(f"{option} {value} is out of range (at most 2**63 - 1)")


def load_yaml(path: str | Path) -> dict:
    """A YAML mapping of RunConfig fields (dashes or underscores), or ConfigError."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {k.replace("-", "_"): v for k, v in data.items()}


def build_config(file_values: dict, overrides: dict) -> RunConfig:
    """Defaults ← file ← command line (only options the user gave), validated; None means not given."""
    known = typing.get_type_hints(RunConfig)
    merged = {k: v for values in (file_values, overrides) for k, v in values.items() if v is not None}
    args = [values.get("strategy_args") for values in (file_values, overrides)]
    if any(a is not None for a in args):  # the command line's parameters are laid over the file's, key by key
        merged["strategy_args"] = {k: v for a in args if a is not None for k, v in parse_strategy_args(a).items()}
    if merged.get("arrival") == "trace" and "rate" not in merged:
        merged["rate"] = 0.0  # a trace keeps its own timing unless a rate is asked for
    if "slo" in merged and isinstance(merged["slo"], (str, list, tuple)):  # comma lists: one item per SLO
        merged["slo"] = slo_items(merged["slo"])
    if merged.get("concurrency"):
        if not closed_loop_terms(merged):
            raise ConfigError(CLOSED_LOOP_CONFLICT)
    if merged.get("num_requests") and "duration_s" not in merged:  # the count alone stops the run
        merged["duration_s"] = count_duration_s(merged["num_requests"], merged.get("rate", DEFAULT_RATE),
                                                merged.get("burstiness", 1.0))
    unknown = sorted(set(merged) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
    return RunConfig(**{k: _typed(k, v, known[k]) for k, v in merged.items()}).validate()


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
            raise ConfigError(f"--strategy-arg {item!r}: expected KEY=VALUE")
        pairs[key.strip().replace("-", "_")] = value.strip()
    return pairs


def fits(value: object, kind: object) -> bool:
    """Is `value` of the type `kind`? An int is a fine float, a bool is no number; a hint that is no class
    (a generic, Any) passes."""
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        base = numbers.Integral if kind is int else numbers.Real
        return isinstance(value, base) and not isinstance(value, bool)
    return not isinstance(kind, (type, types.UnionType)) or isinstance(value, kind)


def _typed(name: str, value: object, kind: type) -> object:
    """`value` as the field's type, or ConfigError ("inf" is a number: YAML reads `rate: inf` as text, and
    summary.json writes the rate inf so)."""
    if kind is float and isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity"):
        value = math.inf
    if not fits(value, kind):
        raise ConfigError(f"setting {name} must be {_KIND_NAMES.get(kind, 'token lengths (e.g. 128, 32-512)')}, "
                          f"got {value!r} ({type(value).__name__})")
    return kind(value) if kind in (int, float) else value  # numpy scalars → plain numbers


_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
               list: "a list"}
