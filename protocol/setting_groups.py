"""A run's settings by group, each field declared once: its default, type, bounds, help text and unit (a
group's title is its --help panel). `protocol.settings.RunConfig` composes the groups, `cli.options` makes
every option from them, and pydantic checks them (strictly: a string is no number, a bool no count).
Beside them: the SLO grammar ('ttft=500ms', comma lists, to seconds: one for every command) and the defaults
of how a run's load stops and is paced (protocol.settings merges them: a count-only stop, the closed loop)."""
import math
import numbers
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError, PydanticUndefined

from batchlab.protocol.errors import BatchlabError, ConfigError, term  # noqa: F401  (the settings' errors)
from batchlab.protocol.plugins import BACKEND_GROUP, entry_point_names

BACKENDS = ("sim", "echo", "hf", "vllm", "openai")  # the built-in backends (worker.factory); plugins by name too
# How a CPU worker's threads share the cores (worker.threads gives each its meaning; docs/workers.md its figures)
THREAD_POLICIES = ("auto", "torch", "all", "spare", "one", "pinned")
MAX_ROWS = 1 << 20  # a message's longest list (protocol.codec.MAX_ARRAY_LEN): a batch of more cannot be sent
DEFAULT_RATE = 10.0  # requests/s
DEFAULT_DURATION_S = 10.0  # ScheduleSettings' duration_s
CLOSED_LOOP_COUNT_DURATION_S = 3600.0  # closed loop, --num-requests without --duration: the count alone stops it
MAX_SCHEDULED_REQUESTS = 100_000_000  # one run's schedule: its planned times alone hold 800 MB
SLO_NAMES = ("ttft", "tpot", "e2e", "queue_wait")
UNITS_S = {"ms": 1e-3, "s": 1.0, "us": 1e-6}
Int = Annotated[int, Field(lt=2**63)]  # every count fits an int64 (a message's integers)
Lengths = str | int | list | dict  # 128, "32-512", "64,128,256", [64, 128], "lognormal:mean=256", {dist: ...}


def setting(default=PydanticUndefined, help: str = "", *, unit: str = "", note: str = "", flag: str = "",
            old_flag: str = "", cli: bool = True, hide_default: bool = False, **bounds) -> object:
    """A field with its help text and unit (`flag`: an option spelling other than --field-name; `old_flag`: a
    former spelling still taken, hidden and warned about; `cli`: False for a field no command takes;
    `hide_default`: --help shows no default)."""
    extra = dict(unit=unit, note=note, flag=flag, old_flag=old_flag, hide_default=hide_default, no_option=not cli)
    return Field(default, description=help, json_schema_extra={k: v for k, v in extra.items() if v}, **bounds)


def flag_of(name: str, schema: type[BaseModel] | None = None) -> str:
    """The command-line option of a setting of `schema` (default: a run's groups): its declared flag, else
    --name-with-dashes."""
    fields = schema.model_fields if schema else {n: f for group in GROUPS for n, f in group.model_fields.items()}
    field = fields.get(name)
    flag = ((field.json_schema_extra or {}).get("flag") if field else None) or "--" + name.replace("_", "-")
    return flag.split("/")[0]


_NO_VALUE = object()


def said(name: str, value: object = _NO_VALUE, schema: type[BaseModel] | None = None, *, meta: str = "") -> str:
    """A setting (with a value, or a placeholder `meta`, if given) as a message names it: inside a command its
    option (`--arrival trace`, `--num-requests N`), elsewhere its Python name (`arrival='trace'`,
    `num_requests=N`)."""
    if meta:
        return term(f"{flag_of(name, schema)} {meta}", f"{name}={meta}")
    if value is _NO_VALUE:
        return term(flag_of(name, schema), name)
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return term(f"{flag_of(name, schema)} {shown}", f"{name}={value!r}")


def closed_loop_conflict() -> str:
    """Why a closed loop refuses a rate or an arrival process, naming the settings as its reader does."""
    return (f"{said('concurrency', meta='N')} (closed loop: each client sends when its last request ended) does not go "
            f"with {said('rate')} or {said('arrival')} (open loop): give one or the other")


def default_of(group: type[BaseModel], name: str) -> object:
    """A field's declared default (for a backend's own settings record, which repeats no default)."""
    return group.model_fields[name].get_default(call_default_factory=True)


def parse_bytes(text: str) -> int:
    """'2GiB', '512MB', '1e9' → bytes; '' → 0 (meaning: the backend's default)."""
    if not text:
        return 0
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 1e3, "mb": 1e6, "gb": 1e9, "b": 1}
    t = str(text).strip().lower()
    unit = next((u for u in units if t.endswith(u)), "")
    t, mult = t[: len(t) - len(unit)], units.get(unit, 1)
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


def refuse(message: str) -> PydanticCustomError:
    """A rule's failure: its message becomes the ConfigError's line as written."""
    return PydanticCustomError("config", message)


def slo_items(items: object) -> list[str]:
    """'ttft=1s,tpot=50ms' or ['ttft=1s,tpot=50ms', 'e2e=5s'] → one item per SLO (comma lists split)."""
    items = [items] if isinstance(items, str) else list(items or [])
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def parse_slos(items: list[str]) -> dict[str, float]:
    """['ttft=500ms', 'tpot=50ms'] or ['ttft=500ms,tpot=50ms'] → {'ttft': 0.5, 'tpot': 0.05} (seconds; no
    unit: ms); ValueError on a bad item, naming it."""
    slos = {}
    for item in slo_items(items):
        match = re.fullmatch(r"\s*(\w+)\s*=\s*([0-9.eE+-]+)\s*(ms|s|us)?\s*", str(item))
        if not match or match.group(1) not in SLO_NAMES:
            raise ValueError(f"{said('slo')} {item!r}: expected NAME=VALUE[ms|s|us] with NAME in "
                             f"{', '.join(SLO_NAMES)}")
        try:
            slos[match.group(1)] = float(match.group(2)) * UNITS_S[match.group(3) or "ms"]
        except ValueError:
            raise ValueError(f"{said('slo')} {item!r}: {match.group(2)!r} is not a number") from None
    return slos


class Group(BaseModel):
    """One group of settings: strict types, no unknown keys, finite numbers (but where a field allows inf)."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value: object, info) -> object:
        """numpy ints as ints (a float takes any number); "inf" text as inf where a float is asked (YAML reads
        `rate: inf` as text, and summary.json writes the rate inf so)."""
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity"):
            return math.inf if cls.model_fields[info.field_name].annotation is float else value
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


class ScheduleSettings(Group, title="Traffic"):
    """The settings a schedule is built from (a replayed schedule brings its own)."""

    arrival: Literal["poisson", "gamma", "constant", "trace"] = setting(
        "poisson", "poisson | gamma | constant | trace (a trace dataset's own arrival times)")
    rate: float = setting(DEFAULT_RATE, "arrival rate; inf: all at t = 0 (with --arrival trace: rescale to this "
                          "mean rate, keeping the burst shape; 0 or not given: the trace's own timing)",
                          unit="requests/s", allow_inf_nan=True)
    duration_s: float = setting(DEFAULT_DURATION_S, "traffic's length (with --num-requests: whichever stop comes "
                                "first)", unit="s", flag="--duration", gt=0)
    burstiness: float = setting(1.0, "gamma shape: 1 = Poisson, < 1 burstier", gt=0)
    seed: Int = setting(0, "seed of the arrival and prompt streams", ge=0)
    dataset: str = setting("sharegpt", "sharegpt | synthetic | azure-conv | azure-code (Azure LLM inference trace "
                           "2023) | trace:PATH (CSV/JSONL: timestamp, input length, output length) | PATH "
                           "(ShareGPT JSON/JSONL)")
    max_new_tokens: Int = setting(128, "cap on output tokens per request", unit="tokens", ge=1)
    max_prompt_len: Int = setting(1024, "drop prompts longer than this", unit="tokens", ge=1)
    trace_start_s: float = setting(0.0, "traces: start this long after the trace's first request", unit="s",
                                   flag="--trace-start", ge=0)
    prompt_lengths: Lengths = setting("", "synthetic prompt lengths: 128 | 32-512 | 64,128,256 | "
                                      "lognormal:mean=256 (default 32-512)", unit="tokens")
    output_lengths: Lengths = setting("", "synthetic output lengths, same forms (default 16-256; capped by "
                                      "--max-new-tokens)", unit="tokens")
    num_requests: Int = setting(0, "stop after N requests or --duration, whichever comes first (no --duration: "
                                "N alone; 0: --duration alone)", note="(0: --duration alone stops the run)", ge=0)


class TrafficSettings(ScheduleSettings):
    """The traffic: a schedule's settings, a replayed schedule, and the closed loop's clients."""

    schedule: str = setting("", "replay this saved schedule.parquet")
    concurrency: Int = setting(0, "closed loop: N clients, each sends its next request when its last one ended "
                               "(plus --think-time-ms); not with --rate/--arrival (docs/traffic.md)",
                               unit="clients", note="(0: open loop, --rate)", ge=0)
    think_time_ms: float = setting(0.0, "closed loop: a client waits this long after an end", unit="ms", ge=0)

    @model_validator(mode="after")
    def _load(self) -> "TrafficSettings":
        """The rate and the stops go together (NaN fails every comparison, so it is refused)."""
        rate, trace, closed = self.rate, self.arrival == "trace", self.concurrency > 0
        rules = [(not math.isnan(rate), lambda: f"{said('rate')} must be a finite number, got {rate}"),
                 (rate > 0 or (rate == 0 and trace), lambda: f"{said('rate')} must be > 0 requests/s (0 only with "
                  f"{said('arrival', 'trace')}: the trace's own rate)"),
                 (math.isfinite(rate) or self.num_requests > 0 or closed,
                  lambda: f"{said('rate', math.inf)} (every request at t = 0) needs {said('num_requests', meta='N')}"),
                 (not closed or math.isinf(rate), closed_loop_conflict),
                 (math.isfinite(rate) or not trace,
                  lambda: f"{said('rate', math.inf)} does not go with {said('arrival', 'trace')}"),
                 (self.planned_requests() <= MAX_SCHEDULED_REQUESTS, self._too_many)]
        for ok, message in rules:
            if not ok:
                raise refuse(message())
        return self

    def planned_requests(self) -> float:
        """About how many requests the schedule plans: the count, or the rate over the duration if fewer (a
        trace at its own timing, or a closed loop without a count: 0, bounded elsewhere)."""
        count = self.num_requests or math.inf
        if self.concurrency > 0 or self.rate == 0 or math.isnan(self.rate):
            return 0.0 if math.isinf(count) else count
        return min(count, self.rate * self.duration_s)

    def _too_many(self) -> str:
        return (f"{said('rate', self.rate)} for {said('duration_s', self.duration_s)} s plans "
                f"{self.planned_requests():.3g} requests, over the {MAX_SCHEDULED_REQUESTS:,} one run's schedule "
                f"holds: lower one of them, or stop it with {said('num_requests')}")


class SchedulerSettings(Group, title="Scheduler"):
    """The batching policy and the scheduler's bounds."""

    strategy: str = setting("dynamic", "naive | dynamic | continuous | sjf | edf | vllm, an installed plugin's "
                            "name, or package.module:Class (from Python also the class itself)", pattern=r"\S",
                            note="a strategy")
    strategy_sha256: str = setting("", "a strategy class given from Python that no other process can import by name "
                                   "(one defined in a notebook): its code's digest, for the run's identity (the code "
                                   "travels with the settings, never into a file)", cli=False)
    strategy_args: dict = setting(help="a strategy parameter, KEY=VALUE (repeatable); a parameter named like an "
                                  "option (e.g. max_batch_size) defaults to that option's value",
                                  flag="--strategy-arg", default_factory=dict)
    batch_size: Int = setting(8, "naive: launch exactly N", unit="rows", ge=1, le=MAX_ROWS,
                              note="(the most rows one message holds)")
    max_batch_size: Int = setting(16, "dynamic, continuous: size cap / worker rows", unit="rows", ge=1, le=MAX_ROWS,
                                  note="(the most rows one message holds)")
    max_wait_ms: float = setting(50.0, "dynamic: age trigger", unit="ms", ge=0)
    max_queue: Int = setting(0, "reject arrivals beyond this queue length", unit="requests", note="(0: unbounded)",
                             ge=0)
    max_queue_tokens: Int = setting(0, "reject arrivals beyond this many queued prompt + output tokens",
                                    unit="tokens", note="(0: unbounded)", ge=0)
    liveness_s: float = setting(30.0, "a worker, the traffic or the scheduler silent this long is declared dead",
                                unit="s", gt=0)
    stall_limit_s: float = setting(60.0, "stream ended, requests queued, every worker idle this long: stalled",
                                   unit="s", note="(0: no limit)", ge=0)


class WorkerSettings(Group, title="Worker"):
    """What every worker backend takes: the model, where it runs, its memory."""

    backend: str = setting("sim", "sim | echo | hf | vllm | openai, a batchlab.backends entry point or "
                                  "package.module:Class")
    model: str = setting("tiny-mistral", "a hub id or a local path")
    workers: Int = setting(1, "worker processes (the scheduler waits for this many)", ge=1)
    memory_budget: str = setting("", "KV memory budget, e.g. 2GiB (default: the backend's)", unit="bytes")
    strict_memory: bool = setting(False, "treat a batch over budget as OOM (CPU)")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = setting(  # refused here, whatever the backend
        "auto", "auto | float32 | float16 | bfloat16")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N")
    max_num_batched_tokens: Int = setting(0, "per engine step, decodes and prompt chunks together (0: vLLM's "
                                          "default; hf continuous: 256 on CPU, 2048 on CUDA); not below "
                                          "--max-batch-size", unit="tokens", ge=0, note="(0: the engine's default)")
    cpu_threads: str = setting("auto", "hf and vllm workers: intra-op threads and how they share the cores: auto "
                               "(= spare) | spare (cores − 1, idle threads sleep) | all (one per core, idle threads "
                               "sleep) | one | torch (torch's default: one per core, spinning) | pinned (spare, the "
                               "worker on its own cores, the harness on the last) | N threads")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, name: str) -> str:
        if name in BACKENDS or ":" in name or name in entry_point_names(BACKEND_GROUP):
            return name
        raise refuse(f"{said('backend')} must be one of {', '.join(BACKENDS)}, a {BACKEND_GROUP} entry point or "
                     f"package.module:Class, got {name!r}")

    @field_validator("cpu_threads", mode="before")
    @classmethod
    def _thread_policy(cls, value: object) -> str:
        text = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
        if text in THREAD_POLICIES or (text.isdigit() and 1 <= int(text) <= 4096):
            return text
        raise refuse(f"--cpu-threads must be one of {', '.join(THREAD_POLICIES)} or a thread count from 1 to 4096, "
                     f"got {value!r}")

    @field_validator("memory_budget")
    @classmethod
    def _bytes(cls, text: str) -> str:
        parse_bytes(text)
        return text

    @property
    def memory_budget_bytes(self) -> int:
        """The budget in bytes (0: the backend's own)."""
        return parse_bytes(self.memory_budget)


class SimBackendSettings(Group, title="Worker: sim"):
    """The sim backend's step-time model."""

    preset: str = setting("a100-llama2-7b", "sim step-time preset (a100-llama2-7b, 3090-mistral-7b, "
                          "cpu-tiny-mistral) or a file batchlab calibrate wrote")
    speed_noise: float = setting(0.0, "sim: run-to-run speed noise, as on a busy shared machine: every step time of "
                                 "a run scaled by one factor exp(σ·z), z ~ N(0, 1) seeded by the run's seed, repeat "
                                 "and label (0.1: about ±10% between runs)", unit="σ of log", ge=0, le=2)
    speed_drift: float = setting(0.0, "sim: the speed moving within a run, as on a busy machine: log speed an "
                                 "Ornstein-Uhlenbeck process of this stationary σ (worker/machine_noise.py)",
                                 unit="σ of log", ge=0, le=2)
    speed_drift_s: float = setting(5.0, "sim: the drift's correlation time", unit="s", gt=0)
    neighbour_share: float = setting(0.0, "sim: a neighbour that takes this share of the worker's time in bursts "
                                     "(every step 1 ÷ (1 − share) as long while it is on)", ge=0, lt=1)
    neighbour_on_s: float = setting(5.0, "sim: the neighbour's mean burst (exponential lengths)", unit="s", gt=0)
    neighbour_off_s: float = setting(10.0, "sim: the neighbour's mean pause between bursts", unit="s", gt=0)


class HFBackendSettings(Group, title="Worker: hf"):
    """The hf backend's own settings."""

    torch_compile: bool = setting(False, "hf static: static KV cache, batches padded to --max-batch-size, decode "
                                  "compiled once (CUDA graphs)")


class VLLMBackendSettings(Group, title="Worker: vllm"):
    """The vllm backend's engine settings."""

    gpu_memory_utilization: float = setting(0.9, "vllm: fraction of GPU memory for the engine", gt=0, le=1)
    max_num_seqs: Int = setting(0, "vllm: max running sequences (0: --max-batch-size)", ge=0)
    enforce_eager: bool = setting(False, "vllm: no CUDA graphs / torch.compile")
    tensor_parallel_size: Int = setting(1, "vllm: tensor-parallel GPUs", ge=1)
    pipeline_parallel_size: Int = setting(1, "vllm: pipeline-parallel stages", ge=1)
    warmup_requests: Int = setting(2, "vllm: requests sent before the run to warm the engine up", ge=0)


class OpenAIBackendSettings(Group, title="Worker: openai"):
    """The openai backend: a server to stream from."""

    endpoint: str = setting("", "openai backend: server URL")
    max_concurrency: Int = setting(64, "openai backend: concurrent streams", ge=1)


class CollectorSettings(Group, title="Collector"):
    """Where the results go and what they are judged by."""

    out: str = setting("runs/latest", "output folder (run: a new runs/<date>-<strategy>-<backend> unless given; "
                       "the roles alone: runs/latest)", hide_default=True, pattern=r"\S",
                       note="a folder (it is empty)")
    slo: list = setting(help="SLOs for goodput, NAME=VALUE with a unit ms, s or us, a comma list or repeated (e.g. "
                        "ttft=1s,tpot=50ms); names ttft, tpot, e2e, queue_wait; a value without a unit is in ms",
                        default_factory=list)

    @field_validator("slo")
    @classmethod
    def _slos(cls, slo: list) -> list:
        parse_slos(slo)
        return slo


class RunSettings(Group, title="Run"):
    """Every role's: the key folder; the launcher's start-up limit; a sweep's names for a run (not identity);
    settings kept as given."""

    keys: str = setting("", "CurveZMQ key folder (needed to bind a non-loopback address)")
    startup_limit_s: float = setting(900.0, "run: start-up (process start until the first request is due: model "
                                     "loads, compilation, warm-up) may take this long, else the run ends",
                                     unit="s", note="(0: no limit)", ge=0)
    label: str = setting("", "the run's name in a sweep (its strategy entry's label; '': the strategy's)", cli=False)
    repeat: Int = setting(0, "which repeat of its sweep point the run is (its seed is the grid's seed + repeat)",
                          ge=0, cli=False)
    extra: dict = setting(help="settings recorded beside the fields (e.g. a replay's unknowns)", cli=False,
                          default_factory=dict)


# RunConfig's bases, its field order: the scheduler's first (strategy), the run's last (extra).
GROUPS = (RunSettings, CollectorSettings, OpenAIBackendSettings, VLLMBackendSettings, HFBackendSettings,
          SimBackendSettings, WorkerSettings, TrafficSettings, SchedulerSettings)
BACKEND_GROUPS = (SimBackendSettings, HFBackendSettings, VLLMBackendSettings, OpenAIBackendSettings)
