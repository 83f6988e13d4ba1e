"""Tune's search: a strategy's knobs searched in the simulator for the highest goodput under an SLO, every
candidate on one schedule.

The search space comes from the strategy's Params dataclass: integer knobs named like batch_size over
powers of two, knobs named like max_wait_ms over a small log grid, bool knobs both ways; the rest (and
any --strategy-arg) hold their value unless --grid names them.
"""
import itertools
import math
import typing
from dataclasses import asdict, fields
from pathlib import Path

from batchlab.collector.summary import Summary
from batchlab.lab.fanout import Fanout
from batchlab.protocol.errors import term
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.runner.preflight import value_text

TUNE_FOLDER = "results/tune"  # tune's default output folder (the command's and api.tune's)

MAX_CANDIDATES = 200
SIZES = (1, 2, 4, 8, 16, 32, 64)  # rows
WAITS_MS = (0, 5, 10, 20, 50, 100, 200)
NO_CHUNK_NOTE = "the simulator's step model has no chunked prefill: a prefill-chunk knob is not searched"
COMPARED = (("goodput", "goodput"), ("ttft_p50_s", "TTFT p50 s"), ("e2e_p50_s", "E2E p50 s"),
            ("throughput_tok_s", "tok/s"))  # (figure, its name): predicted vs measured


def search_record(cfg: RunConfig, grid: list[str], out: Path,
                  fanout: Fanout | None = None) -> tuple[dict, object, list]:
    """Search on one schedule (saved in OUT), rank, write OUT/tune.csv and OUT/tune.json: (the record, the
    schedule, the ranked (knobs, figures) list)."""
    from batchlab.scheduler.strategies import strategy_class
    from batchlab.traffic.run_schedule import make_schedule
    from batchlab.traffic.schedule import save_schedule

    space, held = search_space(cfg, grid)
    out.mkdir(parents=True, exist_ok=True)
    schedule = make_schedule(cfg)  # one schedule: every candidate sees the same arrivals
    save_schedule(schedule, RunDir(out).schedule)
    ranked = search(cfg, schedule, space, fanout)
    untuned = {k: v for k, v in _params(cfg).items() if k in space}
    record = {"strategy": cfg.strategy, "slos": cfg.slos(), "space": space, "held": held,
              "notes": [NO_CHUNK_NOTE] if strategy_class(cfg).mode == BatchingMode.CONTINUOUS else [],
              "settings": cfg.as_settings(),
              "baseline": {"knobs": untuned, **figures(_simulate(cfg, schedule, untuned))},
              "candidates": [{"rank": i + 1, "knobs": knobs, **figs} for i, (knobs, figs) in enumerate(ranked)]}
    _write_csv(out / "tune.csv", record["candidates"])
    write_json_atomic(out / "tune.json", record, default=str)
    return record, schedule, ranked


def default_space(cls: type) -> dict[str, list]:
    """The knobs of cls.Params with a sensible range, each with its values (typed by the field)."""
    kind = getattr(cls, "Params", None)
    if kind is None:
        return {}
    hints = typing.get_type_hints(kind)
    space = {}
    for f in fields(kind):
        t = hints.get(f.name)
        if t is int and f.name.endswith("batch_size"):
            space[f.name] = list(SIZES)
        elif t in (int, float) and f.name.endswith("wait_ms"):
            space[f.name] = [t(v) for v in WAITS_MS]
        elif t is bool:
            space[f.name] = [False, True]
    return space


def parse_grid(items: list[str], cls: type) -> dict[str, list]:
    """['KEY=V1,V2', ...] → {key: [typed values]}; ConfigError naming an unknown knob or a bad value."""
    from batchlab.scheduler.strategies import typed_args

    grid = {}
    for item in items:
        key, sep, values = (s.strip() for s in item.partition("="))
        listed = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not listed:
            raise ConfigError(f"{term('--grid', 'grid')} {item!r}: expected KEY=V1,V2,...")
        key = key.replace("-", "_")
        try:
            typed = [typed_args(cls, {key: v})[key] for v in listed]
        except ConfigError as exc:
            raise ConfigError(f"{term('--grid', 'grid')} {item!r}: {exc}") from None
        grid[key] = list(dict.fromkeys(typed))
    return grid


def search_space(cfg: RunConfig, grid: list[str]) -> tuple[dict[str, list], dict]:
    """(knob → values to search, knob → held value): defaults from Params less any --strategy-arg, then
    --grid; ConfigError past MAX_CANDIDATES or for a candidate the strategy refuses (before any run)."""
    from batchlab.scheduler.strategies import resolve, strategy_class

    cls = strategy_class(cfg)
    space = {k: v for k, v in default_space(cls).items() if k not in cfg.strategy_args}
    space.update(parse_grid(grid, cls))
    n = math.prod(len(v) for v in space.values())
    if n > MAX_CANDIDATES:
        raise ConfigError(f"the search space has {n} candidates, at most {MAX_CANDIDATES}: narrow it with "
                          f"{term('--grid', 'grid')}")
    for knobs in candidates(space):
        resolve(with_knobs(cfg, knobs))
    return space, {k: v for k, v in _params(cfg).items() if k not in space}


def candidates(space: dict[str, list]) -> list[dict]:
    """Every combination of the space's values, in grid order ([{}] for an empty space)."""
    return [dict(zip(space, values)) for values in itertools.product(*space.values())]


def search(cfg: RunConfig, schedule, space: dict[str, list], fanout: Fanout | None = None) -> list[tuple[dict, dict]]:
    """(knobs, figures) of every candidate simulated on `schedule` (fanned out: lab.fanout), best first."""
    tried = candidates(space)
    scored = (fanout or Fanout()).map(_score, [(cfg, knobs) for knobs in tried], schedule)
    return sorted(zip(tried, scored), key=lambda r: rank_key(r[1]))


def _score(schedule, item: tuple[RunConfig, dict]) -> dict:
    """One candidate's figures (a module-level function: local processes and Ray pickle it by name)."""
    cfg, knobs = item
    return figures(_simulate(cfg, schedule, knobs))


def rank_key(figs: dict) -> tuple:
    """Higher goodput, then higher throughput, then lower E2E p99 first."""
    e2e = figs["e2e_p99_s"]
    return -(figs["goodput"] or 0.0), -figs["throughput_tok_s"], math.inf if e2e is None else e2e


def figures(summary: Summary) -> dict:
    """The figures a candidate is ranked and compared by, from a run's summary."""
    s, good = summary, summary.goodput
    return {"goodput": good and good.fraction, "met": good and good.met, "submitted": s.submitted,
            "finished": s.finished, "ttft_p50_s": s.ttft.p50, "ttft_p99_s": s.ttft.p99, "tpot_p50_s": s.tpot.p50,
            "e2e_p50_s": s.e2e.p50, "e2e_p99_s": s.e2e.p99, "throughput_tok_s": s.throughput_tok_s}


def write_predicted(cfg: RunConfig, schedule, best: list[tuple[dict, dict]], out: Path) -> None:
    """The best candidates' simulated runs as run folders (OUT/predicted-<k>/), beside OUT/confirm-<k>/."""
    from batchlab.lab.simulate import simulate_run

    for k, (knobs, _) in enumerate(best, start=1):
        run = with_knobs(cfg, knobs).model_copy(update={"out": str(out / f"predicted-{k}")})
        simulate_run(run, schedule, slos=cfg.slos(), saved_schedule=RunDir(out).schedule)


def rel_error(predicted: float | None, measured: float | None) -> float | None:
    """(measured − predicted) / predicted; None when either is missing or the prediction is 0."""
    return None if predicted in (None, 0) or measured is None else (measured - predicted) / predicted


def _simulate(cfg: RunConfig, schedule, knobs: dict) -> dict:
    from batchlab.simulator.run import simulate

    return simulate(with_knobs(cfg, knobs), schedule, slos=cfg.slos()).summary


def with_knobs(cfg: RunConfig, knobs: dict) -> RunConfig:
    return cfg.model_copy(update={"strategy_args": {**cfg.strategy_args, **knobs}})


def _params(cfg: RunConfig) -> dict:
    """The strategy's parameters for cfg, as a dict ({} for a strategy without Params)."""
    from batchlab.scheduler.strategies import make_params, strategy_class

    params = make_params(strategy_class(cfg), cfg, cfg.strategy_args)
    return {} if params is None else asdict(params)


def _write_csv(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    pd.DataFrame([{"rank": r["rank"], **r["knobs"], **{k: v for k, v in r.items() if k not in ("rank", "knobs")}}
                  for r in rows]).to_csv(path, index=False)


def run_tune(cfg: RunConfig, grid: list[str], out: Path, confirm_k: int, fanout: Fanout | None = None, *,
             on_ranked=None, say=None, run=None) -> dict:
    """Search, write the best predictions, run the best `confirm_k` live on the same schedule; OUT/tune.json's
    record. `on_ranked(record)`: the ranked record once searched; `say`: a line per live run started;
    `run(cfg) -> Summary`: how a confirmation runs (default runner.launcher.launch_run, silent)."""
    record, schedule, ranked = search_record(cfg, grid, out, fanout)
    if on_ranked is not None:
        on_ranked(record)
    write_predicted(cfg, schedule, ranked[:max(confirm_k, 1)], out)
    if confirm_k:
        record["confirm"] = confirm_live(cfg, ranked[:confirm_k], out, say, run)
        write_json_atomic(out / "tune.json", record, default=str)
    return record


def confirm_live(cfg: RunConfig, best: list[tuple[dict, dict]], out: Path, say=None, run=None) -> list[dict]:
    """Run each of `best` live on the saved schedule (OUT/confirm-<k>/); predicted and measured figures."""
    if run is None:
        from batchlab.runner.launcher import launch_run as run
    rows = []
    for k, (knobs, predicted) in enumerate(best, start=1):
        if say is not None:
            say(f"confirming #{k} live on {cfg.backend}: {knobs_text(knobs)}")
        live = with_knobs(cfg, knobs).model_copy(update={"schedule": str(RunDir(out).schedule),
                                                           "out": str(out / f"confirm-{k}")})
        measured = figures(run(live))
        errors = {m: rel_error(predicted[m], measured[m]) for m, _ in COMPARED}
        rows.append({"rank": k, "knobs": knobs, "out": live.out, "predicted": predicted, "measured": measured,
                     "rel_error": errors})
    return rows


def knobs_text(knobs: dict) -> str:
    """'batch_size=8 max_wait_ms=20', or '(none)'."""
    return " ".join(f"{k}={value_text(v)}" for k, v in knobs.items()) or "(none)"
