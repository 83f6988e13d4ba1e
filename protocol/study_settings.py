"""The settings of the studies above one run, each field declared once as the run's groups are
(protocol.setting_groups): a sweep's `grid:` section, the capacity search's knobs (`grid.rates.auto` and the
`capacity` command's options) and calibration's (the `calibrate` command's options). A grid's sections refuse
unknown keys but read YAML as given (5 is a float rate); calibrate's group is strict as a run's groups are.
"""
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, model_validator

from batchlab.protocol.errors import ConfigError, shown
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.setting_groups import Group, WorkerSettings, setting
from batchlab.protocol.settings import checked_group

WIDTH = 0.08  # stop when hi / lo ≤ 1 + WIDTH: the estimate, their geometric mean, within 4% of either
MAX_PROBES = 6
# A probe's or a saturated run's schedule is built in memory, a few hundred bytes a request: bounds far above any
# useful search, checked before anything runs (10**12 arrivals asked for 7 TiB, after the saturated runs)
MAX_SEARCH_REQUESTS = 1_000_000
MAX_STUDY_RUN_S = 86_400.0  # a day of traffic per probe or saturated run
# A twin's capacity probe (lab.twin), virtual traffic: at least TWIN_PROBE_MIN_S (a queue limit's refusals near μ
# are rare events that the settle time does not foresee: 60 s probes on a constant-step model with a limit of 16
# judged sustained what 600 s probes refuse, tests/test_twin.py), at most TWIN_PROBE_MAX_S (closer to μ: undecided,
# said); here because the report states them too
TWIN_PROBE_MIN_S = 600.0
TWIN_PROBE_MAX_S = 1200.0


class Section(BaseModel):
    """One section of a sweep YAML: no unknown keys."""

    model_config = ConfigDict(extra="forbid")


class CapacitySettings(Section, title="Capacity search"):
    """How each strategy's saturated rate μ and capacity are searched (`batchlab capacity`, grid.rates.auto)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a duration is finite, and named as given

    saturated_duration_s: float = setting(12.0, "traffic per saturated run (μ), per strategy and repeat", unit="s",
                                          flag="--saturated-s", gt=0, le=MAX_STUDY_RUN_S)
    # the headline's throughput claim is paired by repeat: 5 short repeats (t = 2.78) find on a busy machine a
    # difference 3 long ones (t = 4.30) miss, in the same time (benchmarks/throughput_power.py, docs/capacity.md)
    saturated_repeats: int = setting(5, "the most saturated runs per strategy (the grid's repeats when more)",
                                     gt=0)
    saturated_min_repeats: int = setting(3, "saturated runs per strategy before the throughput comparisons may "
                                         "stop them (each strategy against naive decided: its interval excludes "
                                         "zero or lies within ±decided_pct)", gt=0)
    decided_pct: float = setting(10.0, "a throughput comparison whose interval lies within ±this is decided "
                                 "(no difference that matters)", unit="%", gt=0)
    saturated_clients: int = setting(0, "closed-loop clients of a saturated run (0: 2 × the batch cap × the "
                                     "workers)", unit="clients", ge=0)
    search_duration_s: float = setting(10.0, "traffic per capacity probe (its queue drains after)", unit="s",
                                       flag="--duration", old_flag="--duration-s", gt=0, le=MAX_STUDY_RUN_S)
    search_requests: int = setting(60, "a probe runs long enough for this many arrivals after its warm-up quarter "
                                   "(a queue's trend read from a dozen says nothing)", unit="requests", gt=0,
                                   le=MAX_SEARCH_REQUESTS)
    width: float = setting(WIDTH, "stop when hi / lo ≤ 1 + width", gt=0)
    max_probes: int = setting(MAX_PROBES, "at most this many probes per strategy", gt=0)
    twin: bool = setting(True, "search each capacity on the study's twin (the simulator calibrated from the "
                         "saturated runs, virtual probes as long as deciding takes), then confirm it with one live "
                         "probe; false: the live search alone (docs/capacity.md)")
    confirm_max_s: float = setting(30.0, "with twin: the live confirmation probe's traffic, at most (deciding "
                                   "close to capacity can take minutes: the verdict is then undecided, said)",
                                   unit="s", gt=0, le=MAX_STUDY_RUN_S)


class AutoRates(CapacitySettings):
    """grid.rates.auto: every strategy's saturated rate μ measured and its capacity searched, then `points`
    rates log-spaced from `low` × the lowest capacity to `high` × the highest; or, when `fractions` are given,
    those fractions of the `probe` entry's burst."""

    fractions: list[PositiveFloat] | None = setting(None, "rates as fractions of the probe entry's capacity")
    points: int = setting(5, "rates log-spaced between low and high: the live grid's, or with twin the twin's "
                          "curves'", ge=2)
    live_loads: list[PositiveFloat] = setting([0.8], "with twin: the live grid's rates, as fractions of the lowest "
                                              "capacity (0.8: the headline's common load)")
    low: float = setting(0.3, "the lowest rate, × the lowest capacity", gt=0)
    high: float = setting(1.3, "the highest rate, × the highest capacity", gt=0)
    probe: str | None = setting(None, "the entry whose burst the fractions scale (default: dynamic, else the first)")
    probe_requests: int = setting(24, "with fractions: the burst, this many requests within probe_duration_s",
                                  gt=0)
    probe_duration_s: float = setting(1.0, "with fractions: the burst's length", unit="s", gt=0)

    @model_validator(mode="after")
    def _span(self) -> "AutoRates":
        if not self.low < self.high:
            raise ValueError("grid.rates.auto needs 0 < low < high")
        return self

    @property
    def spanned(self) -> bool:
        """Rates span every strategy's knee (no fractions given)."""
        return self.fractions is None


class AutoRepeats(Section):
    """grid.repeats.auto: `start` repeats, then more until every headline latency interval is at most width_pct
    percentage points wide, or `max` repeats ran."""

    start: int = setting(1, "repeats run first", gt=0)
    max: int = setting(4, "the most repeats", gt=0)
    width_pct: float = setting(20.0, "stop when every headline latency interval is this narrow", unit="pp", gt=0)

    @model_validator(mode="after")
    def _order(self) -> "AutoRepeats":
        if self.start > self.max:
            raise ValueError("grid.repeats.auto needs 1 ≤ start ≤ max and width_pct > 0")
        return self


class Grid(Section):
    """A sweep's `grid:` section, checked as a whole before anything runs."""

    strategies: list[str | dict | type] = setting(help="the entries: a strategy name or {strategy:, label:, "
                                                  "<settings>} (from Python also a strategy class)",
                                                  default_factory=list)
    rates: list[PositiveFloat] | None = setting(None, "arrival rates (default: base.rate); {auto: {...}}: placed from "
                                        "each strategy's capacity", unit="requests/s", min_length=1)
    rates_auto: AutoRates | None = setting(None, "`rates: {auto: {...}}`")
    concurrency: list[PositiveInt] | None = setting(None, "closed loop: clients per point, in place of rates",
                                            unit="clients", min_length=1)
    repeats: int = setting(1, "runs per point (auto or {auto: {...}}: until the headline is narrow)", gt=0)
    repeats_auto: AutoRepeats | None = setting(None, "`repeats: auto` or `{auto: {...}}`: repeats = its start")
    seed: int = setting(0, "a point's seed is this + its repeat, shared by every strategy")
    point_timeout_s: float = setting(0.0, "from a point's first request (0: a point runs until it drains)",
                                     unit="s", ge=0)
    order: Literal["auto", "interleaved", "grouped"] = setting(
        "auto", "auto: interleaved unless a point runs on a GPU (two idle engines would hold two models)")
    rerun_disturbed: int = setting(0, "run a point, saturated run or probe again, up to this many times, when a "
                                   "burst of other work beyond the sweep's usual disturbed it (0: never)", ge=0)

    @model_validator(mode="before")
    @classmethod
    def _autos(cls, raw: dict) -> dict:
        """`rates` or `repeats` given as {auto: {...}}, {...} or `auto` fill rates_auto / repeats_auto."""
        raw = dict(raw)
        for key in ("rates", "repeats"):
            if raw.get(key) == "auto" or isinstance(raw.get(key), dict):
                value = raw.pop(key)
                raw[f"{key}_auto"] = underscored(value.get("auto", value) or {}) if isinstance(value, dict) else {}
        return raw

    @model_validator(mode="after")
    def _loads(self) -> "Grid":
        if self.repeats_auto:
            self.repeats = self.repeats_auto.start
        if self.concurrency and (self.rates or self.rates_auto):
            raise ValueError("grid.concurrency sweeps closed-loop load: it does not go with grid.rates")
        return self


GRID_KEYS = sorted(set(Grid.model_fields) - {"rates_auto", "repeats_auto"})


class CalibrateSettings(Group, title="Calibrate"):
    """What `batchlab calibrate` measures, on which grid, and how it fits the step model."""

    backend: Literal["hf", "vllm"] = setting("hf", "the backend to measure: hf (static generate() or, with --mode "
                                             "continuous, the HF loop) | vllm")
    model: str = WorkerSettings.model_fields["model"]  # the run's settings of the same names, as declared there
    device: str = WorkerSettings.model_fields["device"]
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = WorkerSettings.model_fields["dtype"]
    mode: Literal[tuple(m.value for m in BatchingMode)] = setting(  # the enum's values, plain strings in settings
        BatchingMode.STATIC.value, "static | continuous (hf; vllm is always continuous)")
    form: Literal["auto", "compute", "memory"] = setting("auto", "compute (a CPU) | memory (a GPU: the bandwidth "
                                                         "form) | auto (by device)")
    out: str = setting("presets/calibrated.yaml", "the preset file to write (.yaml)")
    quick: bool = setting(False, "a small grid (B 1-8 × P 16-192) that runs in minutes on 2 cores")
    name: str = setting("", "the preset's name (default: the file's stem)", hide_default=True)
    batch_sizes: str = setting("", "batch sizes, a comma list (default: the grid's)", unit="rows", hide_default=True)
    prompt_lens: str = setting("", "prompt lengths, a comma list (default: the grid's)", unit="tokens",
                               hide_default=True)
    kind: str = setting("", "with --from: the runs' backend kind to fit, hf | hf-loop | vllm | sim (needed when "
                        "the folders hold several)", hide_default=True)
    weigh: Literal["steps", "time"] = setting("steps", "with --from: a step shape weighs by its steps (√n) or by its "
                                              "share of the runs' time (time)")


class RaySettings(Section, title="Ray"):
    """How a sweep uses a Ray cluster (`batchlab sweep --ray`, lab.ray_sweep; docs/ray.md)."""

    address: str | None = setting(None, "RAY_ADDRESS forms (host:port, auto); None or \"local\": a new local Ray",
                                  cli=False)
    cpus: float = setting(1.0, "--ray: CPUs each point reserves", flag="--ray-cpus", ge=0)
    gpu_resource: str = setting("GPU", "--ray: the resource GPUs are counted in", flag="--ray-gpu-resource")
    shared: bool = setting(False, "--ray: --out is on storage every node sees at the same path", flag="--ray-shared")


def ray_settings(given: "RaySettings | Mapping | str") -> RaySettings:
    """A sweep's Ray settings from what `batchlab sweep --ray ...` or api.sweep's `ray` gives: RaySettings, a
    mapping of them or an address; ConfigError (the setting named as its reader names it) for anything else."""
    if isinstance(given, RaySettings):
        return given
    if not isinstance(given, (Mapping, str)):
        raise ConfigError(f"ray is an address, RaySettings or a mapping of them, not {shown(given)}")
    return checked_group(RaySettings, {"address": given} if isinstance(given, str) else dict(given))


def underscored(mapping: dict) -> dict:
    """The mapping with dashes in its keys read as underscores."""
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}
