"""`batchlab tune`: the search space from a strategy's Params, --grid, a simulated search whose best
candidate beats the rest and the untuned knobs, the one-line errors, and a live --confirm on `sim`."""
import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from batchlab import api
from batchlab.runner.preflight import checked_config
from batchlab.cli.main import app
from batchlab.lab.tune import MAX_CANDIDATES, SIZES, WAITS_MS, candidates, default_space, parse_grid, search_space
from batchlab.protocol.settings import ConfigError
from batchlab.scheduler.policies import Continuous, Dynamic, Naive
from batchlab.simulator.run import simulate
from batchlab.traffic.run_schedule import make_schedule

# Overloaded on the a100 preset: the untuned knobs (16 rows, 50 ms) leave goodput on the table.
TRAFFIC = {"strategy": "dynamic", "rate": 20.0, "duration_s": 10.0, "dataset": "synthetic", "slo": ["ttft=5s"]}
runner = CliRunner()


@dataclass(slots=True)
class ToyParams:
    """A plugin's knobs: one of each kind the default space knows, and two it does not."""

    max_batch_size: int = 8
    max_wait_ms: float = 10.0
    greedy: bool = False
    label: str = "x"
    max_new_tokens: int = 64


class Toy:
    name: ClassVar[str] = "toy"
    mode: ClassVar[str] = "static"
    Params: ClassVar[type] = ToyParams


def tune_cli(*args: str):
    return runner.invoke(app, ["tune", "--dataset", "synthetic", "--duration", "5", *args])


def test_default_space_comes_from_the_params_dataclass():
    space = default_space(Toy)
    assert space == {"max_batch_size": list(SIZES), "max_wait_ms": [float(v) for v in WAITS_MS],
                     "greedy": [False, True]}
    assert all(isinstance(v, float) for v in space["max_wait_ms"])
    assert default_space(Dynamic) == {"max_batch_size": list(SIZES), "max_wait_ms": space["max_wait_ms"]}
    assert default_space(Naive) == {"batch_size": list(SIZES)}
    assert default_space(Continuous) == {"max_batch_size": list(SIZES)}
    assert len(candidates(default_space(Dynamic))) == len(SIZES) * len(WAITS_MS)


def test_a_strategy_arg_holds_its_knob_and_grid_replaces_a_range():
    cfg = checked_config({}, dict(TRAFFIC, strategy_args=["max_wait_ms=20"]))
    space, held = search_space(cfg, ["max_batch_size=8,32"])
    assert space == {"max_batch_size": [8, 32]}
    assert held == {"max_wait_ms": 20.0, "max_new_tokens": cfg.max_new_tokens}


def test_grid_values_are_typed_by_the_knob_and_deduplicated():
    grid = parse_grid(["max_wait_ms=0,20", "max-batch-size=8,8,16"], Dynamic)
    assert grid == {"max_wait_ms": [0.0, 20.0], "max_batch_size": [8, 16]}
    assert [type(v) for v in grid["max_wait_ms"] + grid["max_batch_size"]] == [float, float, int, int]


@pytest.mark.parametrize("item, says", [("rows=4,8", "has no parameter rows"),
                                        ("max_batch_size=a", "must be an integer"),
                                        ("max_wait_ms", "expected KEY=V1,V2"),
                                        ("max_wait_ms=", "expected KEY=V1,V2")])
def test_a_bad_grid_is_refused_naming_it(item, says):
    with pytest.raises(ConfigError, match=says):
        parse_grid([item], Dynamic)


def test_too_many_candidates_are_refused_before_any_simulation():
    cfg = checked_config({}, TRAFFIC)
    many = ",".join(str(n) for n in range(1, MAX_CANDIDATES // len(WAITS_MS) + 2))
    with pytest.raises(ConfigError, match=f"at most {MAX_CANDIDATES}"):
        search_space(cfg, [f"max_batch_size={many}"])


def test_the_best_candidate_beats_every_other_and_the_untuned_knobs(tmp_path):
    cfg = checked_config({}, TRAFFIC)
    record = api.tune(cfg, out=tmp_path).record
    ranked = record["candidates"]
    assert len(ranked) == len(SIZES) * len(WAITS_MS)
    goodputs = [c["goodput"] for c in ranked]
    assert goodputs == sorted(goodputs, reverse=True)
    # independent of tune's bookkeeping: the recorded knobs, simulated again on the saved schedule
    schedule = make_schedule(cfg.model_copy(update={"schedule": str(tmp_path / "schedule.parquet")}))
    best = simulate(cfg.model_copy(update={"strategy_args": ranked[0]["knobs"]}), schedule, slos=cfg.slos()).summary
    untuned = simulate(cfg, schedule, slos=cfg.slos()).summary
    assert best.goodput.fraction == pytest.approx(ranked[0]["goodput"])
    assert best.goodput.fraction >= max(goodputs)
    assert best.goodput.fraction > untuned.goodput.fraction  # tuning pays off here
    assert record["baseline"]["goodput"] == pytest.approx(untuned.goodput.fraction)
    assert (tmp_path / "tune.csv").read_text().count("\n") == len(ranked) + 1
    assert (tmp_path / "predicted-1" / "summary.json").is_file()


def test_the_comma_slo_form_equals_repeated_slos(tmp_path):
    grid = ["--grid", "max_batch_size=8", "--grid", "max_wait_ms=10"]
    a = tune_cli("--slo", "ttft=500ms,tpot=50ms", *grid, "--out", str(tmp_path / "a"))
    b = tune_cli("--slo", "ttft=500ms", "--slo", "tpot=50ms", *grid, "--out", str(tmp_path / "b"))
    assert a.exit_code == b.exit_code == 0, a.output + b.output
    ra, rb = (json.loads((tmp_path / d / "tune.json").read_text()) for d in "ab")
    assert ra["slos"] == rb["slos"] == {"ttft": 0.5, "tpot": 0.05}
    assert ra["candidates"] == rb["candidates"]


@pytest.mark.parametrize("args, says", [((), "needs an SLO"),
                                        (("--slo", "ttft=1s", "--grid", "rows=4"), "has no parameter rows"),
                                        (("--slo", "ttft=1s", "--grid", "max_batch_size=0"), "max_batch_size"),
                                        (("--slo", "speed=1s"), "--slo 'speed=1s'")])
def test_user_errors_are_one_line_and_exit_1(tmp_path, args, says):
    result = tune_cli(*args, "--out", str(tmp_path))
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], result.stderr
    assert not (tmp_path / "tune.json").exists()


@pytest.mark.slow
def test_confirm_runs_the_best_live_on_the_same_schedule(tmp_path):
    result = tune_cli("--slo", "ttft=1s", "--rate", "10", "--duration", "3", "--grid", "max_batch_size=8,16",
                      "--grid", "max_wait_ms=20", "--confirm", "1", "--backend", "sim", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    confirmed = json.loads((tmp_path / "tune.json").read_text())["confirm"]
    assert len(confirmed) == 1
    row = confirmed[0]
    for side in ("predicted", "measured"):
        assert {"goodput", "ttft_p50_s", "e2e_p50_s", "throughput_tok_s"} <= set(row[side])
        assert row[side]["goodput"] is not None
    assert row["measured"]["submitted"] == row["predicted"]["submitted"] > 0  # the one schedule, replayed
    live = yaml.safe_load((tmp_path / "confirm-1" / "config.yaml").read_text())
    assert live["backend"] == "sim" and live["strategy_args"] == row["knobs"]
    assert "simulated vs live" in result.output
