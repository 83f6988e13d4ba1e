"""A sweep's plan: the YAML grid (base: and grid:) parsed into points. Pure: no runs, no I/O but the file.

Layout of a sweep folder: OUT/sweep.json (the index), OUT/_probe/ (the capacity probe for automatic
rates) and OUT/strategy=<label>/rate=<r>/repeat=<k>/ (one run each); the names live in collector.layout.
"""
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError,
                      model_validator)

from batchlab.cli.config import checked_config
from batchlab.collector.capacity import MAX_PROBES, WIDTH
from batchlab.collector.layout import POINT_DEPTH, point_dir
from batchlab.protocol.settings import DEFAULT_RATE, VLLM, ConfigError, RunConfig, load_yaml, vllm_rule
from batchlab.scheduler.strategies import label as strategy_label

DEFAULT_STARTUP_TIMEOUT_S = 900.0  # model loads, engine compilation and warm-up: minutes on a slow host


class SweepError(ValueError):
    """A sweep that cannot run; the CLI prints it as one line and exits 1."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AutoRates(_Strict):
    """grid.rates.auto: every strategy's capacity searched (cli.capacity_search), then `points` rates
    log-spaced from `low` × the lowest capacity to `high` × the highest; or, when `fractions` are given,
    those fractions of the `probe` entry's capacity."""

    fractions: list[PositiveFloat] | None = None
    points: int = Field(5, ge=2)
    low: PositiveFloat = 0.3
    high: PositiveFloat = 1.3
    probe: str | None = None  # the entry whose burst the fractions scale (default: dynamic, else the first)
    probe_requests: PositiveInt = 24  # each search's burst: this many requests within probe_duration_s
    probe_duration_s: PositiveFloat = 1.0
    search_duration_s: PositiveFloat = 10.0  # traffic per capacity probe; its queue drains after
    width: PositiveFloat = WIDTH  # a search stops when hi / lo ≤ 1 + width
    max_probes: PositiveInt = MAX_PROBES

    @model_validator(mode="after")
    def _span(self) -> "AutoRates":
        if not self.low < self.high:
            raise ValueError("grid.rates.auto needs 0 < low < high")
        return self

    @property
    def spanned(self) -> bool:
        """Rates span every strategy's knee (no fractions given)."""
        return self.fractions is None


class AutoRepeats(_Strict):
    """grid.repeats.auto (cli.sweep_repeats): `start` repeats, then more until every headline latency
    interval is at most width_pct percentage points wide, or `max` repeats ran."""

    start: PositiveInt = 1
    max: PositiveInt = 4
    width_pct: PositiveFloat = 20.0

    @model_validator(mode="after")
    def _order(self) -> "AutoRepeats":
        if self.start > self.max:
            raise ValueError("grid.repeats.auto needs 1 ≤ start ≤ max and width_pct > 0")
        return self


class Grid(_Strict):
    """A sweep's `grid:` section, checked as a whole before anything runs."""

    strategies: list[str | dict] = []
    rates: list[PositiveFloat] | None = Field(None, min_length=1)  # req/s; None: base.rate, or rates_auto
    rates_auto: AutoRates | None = None  # `rates: {auto: {...}}`
    concurrency: list[PositiveInt] | None = Field(None, min_length=1)  # closed loop: clients per point
    repeats: PositiveInt = 1
    repeats_auto: AutoRepeats | None = None  # `repeats: auto` or `{auto: {...}}`: repeats = its start
    seed: int = 0
    point_timeout_s: NonNegativeFloat = 0.0  # from a point's first request; 0: a point runs until it drains
    startup_timeout_s: NonNegativeFloat = DEFAULT_STARTUP_TIMEOUT_S  # launch until the first request; 0: none
    order: Literal["auto", "interleaved", "grouped"] = "auto"  # auto: interleaved unless a point runs on a GPU

    @model_validator(mode="before")
    @classmethod
    def _autos(cls, raw: dict) -> dict:
        """`rates` or `repeats` given as {auto: {...}}, {...} or `auto` fill rates_auto / repeats_auto."""
        raw = dict(raw)
        for key in ("rates", "repeats"):
            if raw.get(key) == "auto" or isinstance(raw.get(key), dict):
                value = raw.pop(key)
                raw[f"{key}_auto"] = _keys(value.get("auto", value) or {}) if isinstance(value, dict) else {}
        return raw

    @model_validator(mode="after")
    def _loads(self) -> "Grid":
        if self.repeats_auto:
            self.repeats = self.repeats_auto.start
        if self.concurrency and (self.rates or self.rates_auto):
            raise ValueError("grid.concurrency sweeps closed-loop load: it does not go with grid.rates")
        return self


GRID_KEYS = sorted(set(Grid.model_fields) - {"rates_auto", "repeats_auto"})


def _grid(raw: dict, where: object) -> Grid:
    """The grid, or SweepError naming the key: an unknown one with its close matches."""
    try:
        return Grid(**raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = [str(k).replace("_auto", ".auto") for k in error["loc"] if isinstance(k, str)]
        if error["type"] == "extra_forbidden":
            *section, key = loc
            model = {"rates.auto": AutoRates, "repeats.auto": AutoRepeats}.get(".".join(section))
            known = sorted(model.model_fields) if model else GRID_KEYS
            close = difflib.get_close_matches(key, known, n=2)
            hint = f"did you mean {', '.join(close)}?" if close else f"expected {', '.join(known)}"
            raise SweepError(f"{where}: unknown {'.'.join(['grid', *section])} key {key} ({hint})") from None
        if error["type"] == "value_error":
            raise SweepError(f"{where}: {error['ctx']['error']}") from None
        said = ".".join(k for k in loc if k[0].islower() and "[" not in k)
        raise SweepError(f"{where}: grid.{said}: {error['msg'].lower()}, got {error.get('input')!r}") from None


def checked_auto(values: dict, where: str) -> AutoRates:
    """grid.rates.auto's settings from `values`, or the one-line SweepError."""
    return _grid({"rates": {"auto": values}}, where).rates_auto


@dataclass(slots=True)
class Entry:
    """One line of the grid: a label and the RunConfig settings it lays over `base`."""

    label: str
    overrides: dict


@dataclass(slots=True)
class Plan:
    """A parsed sweep config."""

    base: dict
    entries: list[Entry]
    rates: list[float]  # empty when placed automatically (or closed loop)
    auto: AutoRates | None  # None when rates are given
    repeats: int
    seed: int
    point_timeout_s: float = 0.0  # Grid's fields of the same names
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    order: str = "auto"
    repeats_auto: AutoRepeats | None = None
    concurrency: list[int] = field(default_factory=list)  # closed loop: clients per point, in place of rates

    def limits(self):
        """Each point's time limits (cli.launcher.Limits)."""
        from batchlab.cli.launcher import Limits

        return Limits(startup_s=self.startup_timeout_s, run_s=self.point_timeout_s)


@dataclass(slots=True)
class Point:
    """One run of the grid; its traffic seed is seed + repeat, shared by every strategy."""

    entry: Entry
    rate: float  # closed loop: inf (no planned times)
    repeat: int
    seed: int
    folder: Path
    concurrency: int = 0  # closed loop's clients; 0: open loop at `rate`

    def config(self, base: dict) -> RunConfig:
        """The run's settings: base ← entry ← this point's rate (or clients), seed and folder."""
        load = {"concurrency": self.concurrency} if self.concurrency else {"rate": self.rate}
        values = {**base, **self.entry.overrides, **load, "seed": self.seed + self.repeat, "out": str(self.folder),
                  "label": self.entry.label, "repeat": self.repeat}
        return checked_config(values, {})

    def record(self, status: str, reason: str = "", elapsed_s: float | None = None) -> dict:
        """This point's row in sweep.json."""
        cfg = {**self.entry.overrides}
        return {"label": self.entry.label, "strategy": cfg.get("strategy"), "backend": cfg.get("backend"),
                "rate": None if self.concurrency else self.rate,
                **({"concurrency": self.concurrency} if self.concurrency else {}),
                "repeat": self.repeat, "seed": self.seed + self.repeat,
                "dir": "/".join(self.folder.parts[-POINT_DEPTH:]), "status": status, "reason": reason,
                "elapsed_s": elapsed_s}


def _keys(mapping: dict) -> dict:
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}


def _entry(item: object, base: dict) -> Entry:
    """'dynamic' or {strategy: continuous, backend: hf, label: ..., <RunConfig fields>}."""
    if isinstance(item, str):
        item = {"strategy": item}
    if not isinstance(item, dict) or "strategy" not in item:
        raise SweepError(f"grid.strategies: {item!r} needs a strategy name")
    overrides = _keys(item)
    label = str(overrides.pop("label", ""))
    backend = overrides.get("backend", base.get("backend"))
    if not label:
        strategy = strategy_label(str(overrides["strategy"]))
        label = strategy if strategy == VLLM or "backend" not in overrides else f"{strategy}-{backend}"
    overrides.setdefault("backend", vllm_rule(str(overrides["strategy"]), backend or RunConfig().backend)[1])
    return Entry(label, overrides)


def parse_sets(items: list[str] | None) -> dict:
    """--set items ['duration_s=5', 'grid.repeats=2'] → {'duration_s': 5, 'grid.repeats': 2}; each value is
    read as YAML (5 → int, true → bool, [1, 2] → list); SweepError on an item that is no KEY=VALUE."""
    import yaml

    sets = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise SweepError(f"--set {item!r}: expected KEY=VALUE (e.g. duration_s=5 or grid.repeats=2)")
        try:
            sets[key.strip().replace("-", "_")] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            raise SweepError(f"--set {item!r}: cannot read {value!r}") from None
    return sets


def _with_sets(raw: dict, sets: dict) -> dict:
    """The YAML's mapping with --set laid over it: `grid.KEY` into grid:, `base.KEY` or a bare KEY into base:."""
    base, grid = dict(raw.get("base") or {}), dict(raw.get("grid") or {})
    for key, value in sets.items():
        section, dot, name = key.partition(".")
        target = grid if dot and section == "grid" else base
        if dot and section not in ("grid", "base"):
            raise SweepError(f"--set {key}: a dotted key starts with grid. or base.")
        target[name if dot else key] = value
    return {**raw, "base": base, "grid": grid}


def load_plan(path: str | Path, sets: dict | None = None) -> Plan:
    """Parse and check a sweep YAML (top-level `base:` and `grid:`), with --set overrides (parse_sets)."""
    raw = _with_sets(load_yaml(path), sets) if sets else load_yaml(path)
    extra = sorted(set(raw) - {"base", "grid"})
    if extra:
        raise SweepError(f"{path}: unknown top-level key(s) {', '.join(extra)} (expected base, grid)")
    base, grid = _keys(raw.get("base") or {}), _grid(_keys(raw.get("grid") or {}), path)
    checked_config({**base, "out": "."}, {})  # a wrong name or value in base stops the sweep at once
    entries = [_entry(item, base) for item in grid.strategies]
    labels = [e.label for e in entries]
    if not entries or len(set(labels)) != len(labels):
        raise SweepError(f"grid.strategies must be non-empty with distinct labels, got {labels}")
    if grid.concurrency and ("rate" in base or "arrival" in base):
        raise SweepError("grid.concurrency sweeps closed-loop load: it does not go with base.rate or "
                         "base.arrival (open loop)")
    rates = [] if grid.concurrency or grid.rates_auto else sorted(set(grid.rates or [base.get("rate", DEFAULT_RATE)]))
    return Plan(base, entries, [float(r) for r in rates], grid.rates_auto, grid.repeats, grid.seed,
                grid.point_timeout_s, grid.startup_timeout_s, grid.order, grid.repeats_auto,
                sorted(set(grid.concurrency or [])))


def plan_points(plan: Plan, rates: list[float], out: Path) -> list[Point]:
    """Repeat → rate → strategy, so an interrupted sweep already holds whole comparisons; the strategies'
    order turns by one each repeat, so that none always runs first (or right after another) at a rate."""
    n = len(plan.entries)
    if plan.concurrency:  # closed loop: one point per client count, in its concurrency=<n> folder
        return [Point(e, math.inf, k, plan.seed, out / point_dir(e.label, math.inf, k, concurrency=c), c)
                for k in range(plan.repeats) for c in plan.concurrency
                for e in plan.entries[k % n:] + plan.entries[:k % n]]
    return [Point(e, r, k, plan.seed, out / point_dir(e.label, r, k))
            for k in range(plan.repeats) for r in rates
            for e in plan.entries[k % n:] + plan.entries[:k % n]]


def interleaved(plan: Plan) -> bool:
    """Whether the sweep runs its points in the plan's order, every worker group's pool kept warm (the
    strategies at a rate run minutes apart, not a whole group apart: a machine whose speed drifts shifts
    them alike), or group by group with one pool at a time (`grouped`; `auto` picks it when a point
    runs on a GPU, where two idle engines would hold two models' memory)."""
    if plan.order != "auto":
        return plan.order == "interleaved"
    settings = [{**plan.base, **e.overrides} for e in plan.entries]
    devices = {str(s.get("device") or RunConfig().device) for s in settings
               if s.get("backend", RunConfig().backend) in ("hf", "vllm")}  # sim and openai hold no model
    if "auto" in devices:
        import torch  # what the workers' `auto` will pick

        devices = (devices - {"auto"}) | {"cuda" if torch.cuda.is_available() else "cpu"}
    return devices <= {"cpu"}


def warm_order(points: list[Point], base: dict, key_of, first: str | None = None) -> list[Point]:
    """Points regrouped so that those whose workers share a key (`key_of(RunConfig)`) run one after
    another on the same warm workers; within a group the plan's order (repeat → rate → strategy) is
    kept, groups come in the order of their first point (the group of the entry labelled `first`, the
    probe's, leads: its workers are already warm)."""
    groups: dict = {}
    for p in points:
        try:
            key = key_of(p.config(base))
        except ConfigError:  # a point with a bad setting fails on its own when it runs
            key = ("invalid", p.entry.label)
        groups.setdefault(key, []).append(p)
    ordered = list(groups.values())
    ordered.sort(key=lambda g: not any(p.entry.label == first for p in g))
    return [p for g in ordered for p in g]


def probe_point(plan: Plan, folder: Path) -> tuple[Point, float]:
    """The capacity probe's run (a burst of probe_requests within probe_duration_s on the entry labelled
    grid.rates.auto.probe, else `dynamic`, else the first) and its duration, s."""
    auto, entries = plan.auto, plan.entries
    wanted = auto.probe or next((e.label for e in entries if e.label == "dynamic"), entries[0].label)
    entry = next((e for e in entries if e.label == wanted), None)
    if entry is None:
        raise SweepError(f"grid.rates.auto.probe: no strategy labelled {wanted!r}")
    return Point(entry, auto.probe_requests / auto.probe_duration_s, 0, plan.seed, folder), auto.probe_duration_s


def span_rates(capacities_req_s: list[float], auto: AutoRates) -> list[float]:
    """Rates that show every knee: `points` log-spaced from low × the lowest capacity to high × the highest
    (3 significant digits, distinct)."""
    lowest, highest, n = auto.low * min(capacities_req_s), auto.high * max(capacities_req_s), auto.points
    return sorted({float(f"{lowest * (highest / lowest) ** (i / (n - 1)):.3g}") for i in range(n)})


def auto_rates(capacity_req_s: float, fractions: list[float]) -> list[float]:
    """Fractions of the measured capacity, 3 significant digits, distinct and positive."""
    rates = {float(f"{capacity_req_s * f:.3g}") for f in fractions}
    return sorted(r for r in rates if r > 0)


