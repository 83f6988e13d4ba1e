"""A sweep's plan: the YAML grid (base: and grid:) parsed, with --set or api's changes laid over it. Pure: no runs,
no I/O but the file. Which points it runs, in what order and at which rates: lab.sweep_order.

The `grid:` section is read into its typed settings (protocol.study_settings), checked as a whole before
anything runs: an unknown key, here or under `rates: {auto: ...}` / `repeats: {auto: ...}`, is refused with
its close match. The folder a sweep writes is laid out as lab.sweep's docstring says (names: collector.layout).
"""
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from batchlab.protocol.outcomes import RunOutcome
from batchlab.runner.preflight import checked_config
from batchlab.collector.layout import POINT_DEPTH
from batchlab.protocol.errors import SweepError, shown, term
from batchlab.protocol.settings import DEFAULT_RATE, VLLM, ConfigError, RunConfig, load_yaml, vllm_rule
from batchlab.protocol.study_settings import GRID_KEYS, AutoRates, AutoRepeats, Grid, underscored
from batchlab.scheduler.strategies import label as strategy_label


def parse_grid(raw: dict, where: object) -> Grid:
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
    return parse_grid({"rates": {"auto": values}}, where).rates_auto


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
    order: str = "auto"
    repeats_auto: AutoRepeats | None = None
    concurrency: list[int] = field(default_factory=list)  # closed loop: clients per point, in place of rates
    rerun_disturbed: int = 0  # grid.rerun_disturbed: tries again for a run a burst of other work disturbed
    default_rate: bool = False  # a run's settings that named no rate: a trace's arrival given later keeps its timing

    def limits(self):
        """Each point's time limits (runner.launcher.Limits): the grid's point_timeout_s; its start-up limit is the
        point's own startup_limit_s (base or entry)."""
        from batchlab.runner.launcher import Limits

        return Limits(run_s=self.point_timeout_s)


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

    def record(self, status: RunOutcome, reason: str = "", elapsed_s: float | None = None) -> dict:
        """This point's row in sweep.json."""
        cfg = {**self.entry.overrides}
        return {"label": self.entry.label, "strategy": cfg.get("strategy"), "backend": cfg.get("backend"),
                "rate": None if self.concurrency else self.rate,
                **({"concurrency": self.concurrency} if self.concurrency else {}),
                "repeat": self.repeat, "seed": self.seed + self.repeat,
                "dir": "/".join(self.folder.parts[-POINT_DEPTH:]), "status": RunOutcome(status).value, "reason": reason,
                "elapsed_s": elapsed_s}


def _entry(item: object, base: dict) -> Entry:
    """'dynamic' or {strategy: continuous, backend: hf, label: ..., <RunConfig fields>} (from Python a strategy
    may be the class itself)."""
    if isinstance(item, (str, type)):
        item = {"strategy": item}
    if not isinstance(item, dict) or "strategy" not in item:
        raise SweepError(f"grid.strategies: {item!r} needs a strategy name")
    overrides = underscored(item)
    label = str(overrides.pop("label", ""))
    backend = overrides.get("backend", base.get("backend"))
    if not label:
        given = overrides["strategy"]
        strategy = strategy_label(given if isinstance(given, type) else str(given))
        label = strategy if strategy == VLLM or "backend" not in overrides else f"{strategy}-{backend}"
    overrides.setdefault("backend", vllm_rule(str(overrides["strategy"]), backend or RunConfig().backend)[1])
    return Entry(label, overrides)


def _distinct(entries: list[Entry], where: str) -> list[Entry]:
    """The grid's entries, or SweepError when there are none or two share a label."""
    labels = [e.label for e in entries]
    if not labels or len(set(labels)) != len(labels):
        raise SweepError(f"{where} must be non-empty with distinct labels, got {labels}")
    return entries


def parse_sets(items: list[str] | None) -> dict:
    """--set items ['duration_s=5', 'grid.repeats=2'] → {'duration_s': 5, 'grid.repeats': 2}; each value is
    read as YAML (5 → int, true → bool, [1, 2] → list); SweepError on an item that is no KEY=VALUE."""
    import yaml

    sets = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise SweepError(f"{term('--set', 'sets')} {item!r}: expected KEY=VALUE (e.g. duration_s=5 or "
                             "grid.repeats=2)")
        try:
            sets[key.strip().replace("-", "_")] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            raise SweepError(f"{term('--set', 'sets')} {item!r}: cannot read {value!r}") from None
    return sets


AUTO_KEY = "rates.auto."  # grid.rates.auto.KEY: one setting of the automatic rates' search (AutoRates)


def _not_automatic(key: str) -> SweepError:
    """A change of one automatic rates' setting (grid.rates.auto.KEY) to a plan whose rates are not automatic."""
    return SweepError(f"grid.{AUTO_KEY}{key}: the plan's rates are not automatic (grid.rates: auto)")


def _auto_rates(rates: object, key: str) -> dict:
    """The automatic rates' settings a grid's `rates:` holds (`auto`, or a mapping with `auto:`), for a change of
    one of them (grid.rates.auto.KEY); SweepError when its rates are not automatic."""
    if rates == "auto":
        return {}
    if isinstance(rates, Mapping) and "auto" in rates:
        return dict(rates["auto"] or {})
    raise _not_automatic(key)


def _with_sets(raw: dict, sets: dict) -> dict:
    """The YAML's mapping with --set laid over it: `grid.KEY` into grid:, `grid.rates.auto.KEY` into its automatic
    rates' settings, `base.KEY` or a bare KEY into base:."""
    base, grid = dict(raw.get("base") or {}), dict(raw.get("grid") or {})
    for key, value in sets.items():
        section, dot, name = key.partition(".")
        target = grid if dot and section == "grid" else base
        if dot and section not in ("grid", "base"):
            raise SweepError(f"{term('--set', 'sets')} {key}: a dotted key starts with grid. or base.")
        if target is grid and name.startswith(AUTO_KEY):
            key = name.removeprefix(AUTO_KEY)
            grid["rates"] = {"auto": {**_auto_rates(grid.get("rates"), key), key: value}}
            continue
        target[name if dot else key] = value
    return {**raw, "base": base, "grid": grid}


def load_plan(path: str | Path, sets: dict | None = None) -> Plan:
    """Parse and check a sweep YAML (top-level `base:` and `grid:`), with --set overrides (parse_sets)."""
    return parse_plan(load_yaml(path), path, sets)


def parse_plan(raw: dict, path: str | Path = "the plan", sets: dict | None = None) -> Plan:
    """Parse and check a sweep's mapping (`base:` and `grid:`, as its YAML holds them; `path` names it in errors)."""
    raw = _with_sets(raw, sets) if sets else raw
    extra = sorted(set(raw) - {"base", "grid"})
    if extra:
        raise SweepError(f"{path}: unknown top-level key(s) {', '.join(extra)} (expected base, grid)")
    base, grid = underscored(raw.get("base") or {}), underscored(raw.get("grid") or {})
    if "startup_timeout_s" in grid:  # the former spelling of the run's own start-up limit
        base["startup_limit_s"] = grid.pop("startup_timeout_s")
    grid = parse_grid(grid, path)
    checked_config({**base, "out": "."}, {})  # a wrong name or value in base stops the sweep at once
    entries = _distinct([_entry(item, base) for item in grid.strategies], "grid.strategies")
    if grid.concurrency and ("rate" in base or "arrival" in base):
        raise SweepError("grid.concurrency sweeps closed-loop load: it does not go with base.rate or "
                         "base.arrival (open loop)")
    own = 0.0 if base.get("arrival") == "trace" else DEFAULT_RATE  # a trace keeps its own timing unless rated
    rates = [] if grid.concurrency or grid.rates_auto else sorted(set(grid.rates or [base.get("rate", own)]))
    return Plan(base, entries, [float(r) for r in rates], grid.rates_auto, grid.repeats, grid.seed,
                grid.point_timeout_s, grid.order, grid.repeats_auto,
                sorted(set(grid.concurrency or [])), grid.rerun_disturbed)


GRID_CHANGES = ("strategies", "rates", "repeats", "seed", "concurrency", "order", "point_timeout_s")
ALIASES = {"strategy": "strategies", "rate": "rates"}  # a change of a run's one strategy or rate: the grid's


def plan_from(given: object, changes: dict | None = None) -> tuple[Plan, str]:
    """(the checked plan, the YAML it came from or ""): `given` is a Plan (copied), a sweep's mapping (`base:`
    and `grid:`), a run's settings (one strategy at one rate), or a YAML file's path holding either; `changes`
    are laid over it (`changed`). ConfigError for anything else, or a file that cannot be read."""
    import copy

    source = ""
    if isinstance(given, Plan):
        plan = copy.deepcopy(given)
    elif isinstance(given, (str, Path)):
        plan, source = _mapping_plan(load_yaml(given), given), str(given)
    elif isinstance(given, Mapping):
        plan = _mapping_plan(copy.deepcopy(dict(given)), "the plan")
    else:
        raise ConfigError(f"a plan is a sweep's mapping (base: and grid:), a run's settings (a mapping or a "
                          f"RunConfig), a Plan or a YAML file's path, not {shown(given)}")
    return changed(plan, changes or {}), source


def _mapping_plan(raw: dict, where: object) -> Plan:
    """A sweep's mapping (base: and grid:) or a run's flat settings, parsed."""
    if raw and set(raw) <= {"base", "grid"}:
        return parse_plan(raw, where)
    return flat_plan(underscored(raw))


CAPACITY_SUFFIX = "-capacity"  # a capacity search's default folder: results/<the YAML's name>-capacity


def study_folder(source: str | Path, suffix: str = "") -> Path:
    """A study's default folder: results/<its YAML's name><suffix> (a sweep's, or with CAPACITY_SUFFIX a
    capacity search's)."""
    return Path("results") / f"{Path(source).stem}{suffix}"


def refuse_new_labels(plan: Plan, strategies: object) -> None:
    """SweepError naming the strategies given by name that are no label of the plan's grid: a study of the grid's
    entries (a capacity search) takes only its labels, a name is no new entry there."""
    labels = {e.label for e in plan.entries}
    unknown = sorted({i for i in _items(strategies) if isinstance(i, str)} - labels)
    if unknown:
        raise SweepError(f"{term('--strategy', 'strategies')}: no grid entry labelled {', '.join(unknown)}")


def flat_plan(values: dict) -> Plan:
    """A run's settings as a one-entry, one-rate grid; checked as a sweep's base is."""
    values = dict(values)
    cfg = checked_config({**values, "out": "."}, {})
    strategy = values.pop("strategy", cfg.strategy)
    default_rate = values.pop("rate", None) is None
    return Plan(values, [Entry(strategy_label(strategy), {"strategy": strategy})], [cfg.rate], None, 1, cfg.seed,
                default_rate=default_rate)


def changed(plan: Plan, changes: dict) -> Plan:
    """`plan` with `changes` laid over it (in place): `strategies` (a list, comma text or one item: a label of
    the plan's grid keeps that entry, anything else is a new entry: a name, a class, a mapping), `rates`,
    `repeats`, `seed`, `concurrency`, `order` and `point_timeout_s` change the grid (so do `strategy` and
    `rate`: the one a run's settings name); `grid.KEY` and `base.KEY` name a section, `grid.rates.auto.KEY` one
    setting of the automatic rates' search; any other name is a setting of every run; None is no change. Checked
    as a plan's YAML is."""
    grid, base, auto = {}, {}, {}
    for key, value in changes.items():
        if value is None:  # not given
            continue
        section, dot, name = str(key).partition(".")
        if section == "grid" and name.startswith(AUTO_KEY):
            auto[name.removeprefix(AUTO_KEY)] = value
            continue
        name = ALIASES.get(name if dot else key, name if dot else key)
        if dot and section not in ("grid", "base"):
            raise SweepError(f"{key}: a dotted key starts with grid. or base.")
        (grid if (section == "grid" if dot else name in GRID_CHANGES) else base)[name] = value
    plan.base.update(underscored(base))
    check = bool(base) or "strategies" in grid  # the runs' settings changed: each entry's checked now
    if "strategies" in grid:
        by_label = {e.label: e for e in plan.entries}
        items = _items(grid.pop("strategies"))
        plan.entries = _distinct([by_label[i] if isinstance(i, str) and i in by_label else _entry(i, plan.base)
                                  for i in items], "strategies")
    if "rates" in grid:
        rates = grid.pop("rates")
        checked = parse_grid({"rates": rates if isinstance(rates, dict) or rates == "auto" else _items(rates)},
                             "the changes")
        plan.rates, plan.auto = [float(r) for r in sorted(set(checked.rates or []))], checked.rates_auto
        plan.default_rate = False
    elif plan.default_rate and plan.base.get("arrival") == "trace":
        plan.rates = [0.0]  # a trace keeps its own timing unless a rate is asked for (as a run's settings do)
    if auto:
        if plan.auto is None:
            raise _not_automatic(next(iter(auto)))
        plan.auto = checked_auto({**plan.auto.model_dump(exclude_unset=True), **auto}, "the changes")
    if grid:
        checked = parse_grid({k: _items(v) if k == "concurrency" else v for k, v in grid.items()}, "the changes")
        for name in grid:
            setattr(plan, name, sorted(set(checked.concurrency)) if name == "concurrency" else getattr(checked, name))
        plan.repeats_auto = checked.repeats_auto if "repeats" in grid else plan.repeats_auto
    if plan.concurrency:  # closed loop: clients per point, no rates
        plan.rates, plan.auto = [], None
    for entry in plan.entries if check else []:
        checked_config({**plan.base, **entry.overrides, "out": "."}, {})
    return plan


def _items(value: object) -> list:
    """A list as given, comma text as its items (numbers read as numbers), or one value as a list of one."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
        try:
            return [float(v) for v in items]
        except ValueError:
            return items
    return [value]
