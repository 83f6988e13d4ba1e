"""Sweep config parsing and the grid: labels, rates (given or automatic), seeds shared by strategies."""
from pathlib import Path

import pytest
import yaml

from batchlab.protocol.settings import ConfigError
from batchlab.lab.sweep_plan import SweepError, load_plan
from batchlab.lab.sweep_order import auto_rates, interleaved, plan_points
from batchlab.collector.layout import point_dir

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_strategy_names_and_mappings_become_labelled_entries(tmp_path):
    plan = load_plan(write(tmp_path, {"base": {"backend": "sim"}, "grid": {"strategies": [
        "naive", {"strategy": "continuous", "backend": "hf"}, "vllm",
        {"strategy": "dynamic", "label": "dyn-wide", "max_batch_size": 32}], "rates": [5]}}))
    assert [e.label for e in plan.entries] == ["naive", "continuous-hf", "vllm", "dyn-wide"]
    assert plan.entries[1].overrides == {"strategy": "continuous", "backend": "hf"}
    assert plan.entries[3].overrides["max_batch_size"] == 32
    assert plan.entries[2].overrides["backend"] == "vllm" and plan.entries[0].overrides["backend"] == "sim"


def test_a_vllm_run_is_continuous_on_the_vllm_backend_and_labelled_vllm_wherever_it_is_read():
    from batchlab.collector.parts import run_label
    from batchlab.protocol.settings import RunConfig, vllm_rule

    assert vllm_rule("vllm", "sim") == ("continuous", "vllm", "vllm")
    assert vllm_rule("continuous", "vllm") == ("continuous", "vllm", "vllm")
    assert vllm_rule("dynamic", "hf") == ("dynamic", "hf", "dynamic")
    cfg = RunConfig(strategy="vllm")
    assert (cfg.strategy, cfg.backend) == ("continuous", "vllm")
    assert run_label(cfg.as_settings()) == "vllm" and run_label({"strategy": "sjf", "backend": "hf"}) == "sjf"


def test_every_strategy_at_a_rate_shares_the_traffic_seed_of_its_repeat(tmp_path):
    plan = load_plan(write(tmp_path, {"base": {"backend": "sim"}, "grid": {
        "strategies": ["naive", "dynamic"], "rates": [2, 8], "repeats": 2, "seed": 10}}))
    points = plan_points(plan, plan.rates, tmp_path / "out")
    assert len(points) == 2 * 2 * 2
    configs = [(p.entry.label, p.rate, p.repeat, p.config(plan.base)) for p in points]
    for label, rate, repeat, cfg in configs:
        assert cfg.seed == 10 + repeat and cfg.rate == rate and cfg.strategy == label
        assert cfg.out == str(tmp_path / "out" / point_dir(label, rate, repeat))
    assert [c[:3] for c in configs[:4]] == [("naive", 2, 0), ("dynamic", 2, 0), ("naive", 8, 0), ("dynamic", 8, 0)]


def test_the_strategies_order_turns_each_repeat(tmp_path):
    plan = load_plan(write(tmp_path, {"base": {"backend": "sim"}, "grid": {
        "strategies": ["naive", "dynamic", "continuous"], "rates": [2, 8], "repeats": 3}}))
    order = [(p.repeat, p.rate, p.entry.label) for p in plan_points(plan, plan.rates, tmp_path / "out")]
    firsts = [order[i][2] for i in range(0, len(order), 3)]
    assert firsts == ["naive", "naive", "dynamic", "dynamic", "continuous", "continuous"]
    assert order[6:9] == [(1, 2.0, "dynamic"), (1, 2.0, "continuous"), (1, 2.0, "naive")]
    assert sorted(order) == sorted((k, r, e) for k in range(3) for r in (2.0, 8.0)
                                   for e in ("naive", "dynamic", "continuous"))


@pytest.mark.parametrize("base, entry, order, expected", [
    ({"backend": "hf", "device": "cpu"}, {"strategy": "vllm", "device": "cpu"}, None, True),
    ({"backend": "hf", "device": "cpu"}, {"strategy": "vllm", "device": "cuda"}, None, False),
    ({"backend": "hf", "device": "cuda:1"}, {"strategy": "continuous"}, None, False),
    ({"backend": "hf", "device": "cuda"}, {"strategy": "continuous"}, "interleaved", True),
    ({"backend": "hf", "device": "cpu"}, {"strategy": "continuous"}, "grouped", False),
    ({"backend": "sim", "device": "cuda"}, {"strategy": "continuous"}, None, True),  # a simulator holds no model
])
def test_sweeps_interleave_strategies_unless_a_gpu_would_hold_two_engines(tmp_path, base, entry, order, expected):
    grid = {"strategies": ["naive", entry], "rates": [2]} | ({"order": order} if order else {})
    assert interleaved(load_plan(write(tmp_path, {"base": base, "grid": grid}))) is expected


def test_a_sweep_order_must_be_known(tmp_path):
    with pytest.raises(SweepError, match="grid.order"):
        load_plan(write(tmp_path, {"grid": {"strategies": ["naive"], "rates": [2], "order": "random"}}))


def test_auto_rates_are_fractions_of_the_measured_capacity():
    assert auto_rates(12.34, [0.1, 0.5, 1.0, 1.5]) == [1.23, 6.17, 12.3, 18.5]
    assert auto_rates(10.0, [0.5, 0.5, 0.0]) == [5.0]


def test_auto_rates_config_keeps_its_probe_settings(tmp_path):
    plan = load_plan(write(tmp_path, {"grid": {"strategies": ["dynamic"], "rates": {
        "auto": {"fractions": [0.5, 1.0], "probe_duration_s": 2}}}}))
    assert plan.rates == [] and plan.auto.fractions == [0.5, 1.0] and plan.auto.probe_duration_s == 2
    assert not plan.auto.spanned


@pytest.mark.parametrize("data, message", [
    ({"grid": {"strategies": []}}, "non-empty"),
    ({"grid": {"strategies": ["naive", "naive"]}}, "distinct"),
    ({"grid": {"strategies": ["naive"], "rates": [0]}}, r"grid.rates: input should be greater than 0, got 0"),
    ({"grid": {"strategies": [{"backend": "hf"}]}}, "strategy name"),
    ({"grid": {"strategies": ["naive"]}, "points": 3}, "unknown top-level"),
    ({"grid": {"strategies": ["naive"], "rates": [2], "repeat": 3}}, r"unknown grid key.*did you mean repeats\?"),
    ({"grid": {"strategies": ["naive"], "zzz": 3}}, r"unknown grid key.*expected concurrency"),
    ({"grid": {"strategies": ["naive"], "rates": {"auto": {"pionts": 4}}}},
     r"unknown grid.rates.auto key pionts \(did you mean points\?\)"),
    ({"grid": {"strategies": ["naive"], "repeats": {"auto": {"strat": 2}}}},
     r"unknown grid.repeats.auto key strat \(did you mean start\?\)"),
    ({"grid": {"strategies": ["naive"], "rates": {"auto": {"low": 2, "high": 1}}}}, "0 < low < high"),
    ({"grid": {"strategies": ["naive"], "rates": {"auto": {"fractions": [0.5, -1]}}}},
     r"grid.rates.auto.fractions: input should be greater than 0, got -1"),
    ({"grid": {"strategies": ["naive"], "concurrency": [2], "rates": [1]}}, "does not go with grid.rates"),
])
def test_impossible_sweeps_are_rejected_with_one_line(tmp_path, data, message):
    with pytest.raises(SweepError, match=message):
        load_plan(write(tmp_path, data))


def test_a_wrong_setting_in_base_stops_the_sweep_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting\(s\): rat \(did you mean rate"):
        load_plan(write(tmp_path, {"base": {"rat": 3}, "grid": {"strategies": ["naive"]}}))


@pytest.mark.parametrize("name", ["smoke", "cpu", "cpu-tpot", "full"])
def test_shipped_configs_parse(name):
    plan = load_plan(ROOT / "configs" / f"{name}.yaml")
    assert plan.entries and (plan.rates or plan.auto)


def test_full_config_is_the_seed_plan():
    plan = load_plan(ROOT / "configs" / "full.yaml")
    assert plan.rates == [5.0, 20.0, 50.0] and plan.repeats == 3 and plan.base["duration_s"] == 60


def test_a_strategy_with_no_rate_sustained_places_the_grid_by_its_mu_not_mus_upper_bound():
    from batchlab.lab.sweep import placing_rate

    # beside heavy other work, two saturated repeats read dynamic's μ 1.88 [0.00123, 2860]; every probe was
    # undecided: the grid once reached λ = 5460 req/s from that upper bound
    noisy = {"estimate_req_s": None, "lo_req_s": None, "hi_req_s": 2860.0,
             "saturated": {"req_s": 1.88, "req_s_lo": 0.00123, "req_s_hi": 2860.0}}
    assert placing_rate(noisy) == 1.88
    assert placing_rate({**noisy, "lo_req_s": 1.2}) == 1.2
    assert placing_rate({**noisy, "estimate_req_s": 1.5, "lo_req_s": 1.2}) == 1.5
    assert placing_rate({"estimate_req_s": None, "lo_req_s": None, "hi_req_s": 3.0}) == 3.0  # a grid, no μ
