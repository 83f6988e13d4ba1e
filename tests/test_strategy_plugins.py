"""Strategies as plugins: found by name, entry point or package.module:Class, with typed parameters;
the example plugin in examples/strategies/ run live, swept and simulated from outside the package."""
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata

import pandas as pd
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from batchlab.runner.preflight import checked_config
from batchlab.cli.main import app
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.scheduler.policies import Decision
from batchlab.scheduler.strategies import ENTRY_POINT_GROUP, resolve
from batchlab.collector.layout import point_dir
from tests.conftest import ROOT

EXAMPLES = ROOT / "examples" / "strategies"
PLUGIN = "token_budget:TokenBudget"
COMMON = ["--preset", "a100-llama2-7b", "--dataset", "synthetic", "--max-new-tokens", "16",
          "--seed", "3", "--max-wait-ms", "500"]
TOKENS = ["--strategy-arg", "max_batch_tokens=600"]  # synthetic prompts: 32-512 tokens, a few per batch


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def config(**values) -> RunConfig:
    return checked_config(values, {})


def test_builtins_take_their_mode_and_rows_from_the_policy_class():
    naive, dynamic = config(strategy="naive", batch_size=6), config(strategy="dynamic", max_batch_size=12)
    continuous = config(strategy="continuous", max_batch_size=4)
    assert [(s.name, s.mode, s.rows) for s in map(resolve, (naive, dynamic, continuous))] == [
        ("naive", "static", 6), ("dynamic", "static", 12), ("continuous", "continuous", 4)]


def test_a_parameter_takes_the_same_named_run_setting_unless_strategy_args_sets_it():
    policy = resolve(config(strategy="dynamic", max_batch_size=12, max_wait_ms=30)).policy()
    assert (policy.max_batch_size, policy.max_wait_s) == (12, 0.03)
    cfg = config(strategy="dynamic", max_batch_size=12, strategy_args={"max_batch_size": 5})
    assert resolve(cfg).policy().max_batch_size == 5 and resolve(cfg).rows == 5  # the worker follows


def test_command_line_strategy_args_are_typed_and_laid_over_the_files():
    cfg = checked_config({"strategy": "dynamic", "strategy_args": {"max_wait_ms": 5, "max_batch_size": 3}},
                         {"strategy_args": ["max-batch-size=7"]})
    assert cfg.strategy_args == {"max_wait_ms": 5.0, "max_batch_size": 7}
    assert type(cfg.strategy_args["max_wait_ms"]) is float


@pytest.mark.parametrize("values, needles", [
    ({"strategy": "dynamic", "strategy_args": {"max_wait": 5}},
     ["dynamic has no parameter max_wait", "max_batch_size, max_wait_ms, max_new_tokens"]),
    ({"strategy": "dynamic", "strategy_args": ["max_batch_size=eight"]}, ["max_batch_size must be an integer", "eight"]),
    ({"strategy": "naive", "strategy_args": ["batch_size=0"]}, ["batch_size must be ≥ 1"]),
    ({"strategy": "dynamic", "strategy_args": ["max_batch_size"]}, ["expected KEY=VALUE"]),
    ({"strategy": "fastest"}, ["unknown strategy 'fastest'", "naive, dynamic, continuous, sjf, edf, vllm"]),
    ({"strategy": "no_such_module:Policy"}, ["cannot import no_such_module"]),
    ({"strategy": "token_budget:NoSuchClass"}, ["token_budget has no 'NoSuchClass'"]),
    ({"strategy": "token_budget:Params"}, ["not a policy class", "name, mode, decide"]),
])
def test_a_bad_strategy_or_parameter_is_a_config_error_naming_it(examples_on_path, values, needles):
    with pytest.raises(ConfigError) as error:
        config(**values)
    for needle in needles:
        assert needle in str(error.value)


def test_a_plugin_class_loads_by_module_path_with_typed_parameters(examples_on_path):
    strategy = resolve(config(strategy=PLUGIN, max_batch_size=5, max_wait_ms=30,
                              strategy_args=["max_batch_tokens=600"]))
    policy = strategy.policy()
    assert (strategy.name, strategy.mode, strategy.rows) == ("token_budget", "static", 5)
    assert (policy.params.max_batch_tokens, policy.params.max_wait_ms) == (600, 30.0)


@dataclass
class LateParams:
    rows: int = 3


class Late:
    """A continuous strategy named like a static one: the worker's mode comes from `mode`."""

    name, mode, Params = "naive_looking", "continuous", LateParams

    def __init__(self, params: LateParams) -> None:
        self.rows = params.rows

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        return Decision(len(queue), "late")

    def on_batch_done(self, size: int, oom: bool) -> None:
        pass


def test_an_entry_point_names_a_strategy(monkeypatch):
    point = metadata.EntryPoint("late", f"{__name__}:Late", ENTRY_POINT_GROUP)
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [point] if kw.get("group") == ENTRY_POINT_GROUP else real(**kw))
    strategy = resolve(config(strategy="late", strategy_args={"rows": 2}))
    assert (strategy.name, strategy.mode, strategy.rows) == ("naive_looking", "continuous", 2)
    with pytest.raises(ConfigError, match="choose from naive, dynamic, continuous, sjf, edf, vllm, late"):
        config(strategy="early")


def test_simulate_checks_strategy_args_against_the_strategy_given_on_the_command_line(examples_on_path):
    from batchlab.lab.simulate import plan_simulation
    sim = plan_simulation(None, {"strategy": PLUGIN, "strategy_args": ["max_batch_tokens=600"], "rate": "20"})
    assert [e.overrides["strategy"] for e in sim.plan.entries] == [PLUGIN]
    assert sim.plan.base["strategy_args"] == ["max_batch_tokens=600"]
    with pytest.raises(ConfigError, match="dynamic has no parameter max_batch_tokens"):
        plan_simulation(None, {"strategy": "dynamic", "strategy_args": ["max_batch_tokens=600"], "rate": "20"})


def test_a_bad_strategy_arg_on_the_command_line_is_one_line():
    result = CliRunner().invoke(app, ["run", "--strategy", "dynamic", "--strategy-arg", "size=4"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: strategy dynamic has no parameter size (parameters: max_batch_size, max_wait_ms, max_new_tokens)"]


def test_run_help_shows_every_settings_default_from_run_config():
    run = get_command(app).commands["run"]
    defaults = {name: f.default for name, f in RunConfig.model_fields.items() if f.default not in (None, "")
                and f.default_factory is None and name != "out"}  # run: a new folder per run
    help_text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "320", "TERMINAL_WIDTH": "320"}).output
    lines: dict[str, str] = {}  # an option's flag → its rows in the table (its default may wrap onto the next)
    flag = ""
    for line in help_text.splitlines():
        if line.startswith("│ --"):
            flag = line.split()[1]
        if line.startswith("│ "):
            lines[flag] = lines.get(flag, "") + line
    checked = 0
    for param in run.params:
        if param.name in defaults:
            value = defaults[param.name]
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            assert f"[default: ({shown})]" in lines[param.opts[0]], param.name
            checked += 1
    assert checked >= 25  # the run command's settings, not a vacuous pass


def plugin_cli(*args: str, cwd, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """`batchlab ARGS` run from `cwd` with only the examples folder added to the import path."""
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    proc = subprocess.run([sys.executable, "-m", "batchlab.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def assert_token_budget_ran(out) -> None:
    """Every request finished; the batches carry the plugin's own launch reason; the run records it."""
    requests, batches = pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "batches.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert set(requests.status) == {"finished"}
    assert "tokens" in set(batches.launch_reason) and batches["size"].sum() == len(requests)
    assert summary["settings"]["strategy"] == PLUGIN and summary["settings"]["strategy_args"] == {"max_batch_tokens": 600}


@pytest.mark.slow
def test_the_example_plugin_runs_live_and_simulated_from_outside_the_package(tmp_path):
    plugin_cli("run", "--backend", "sim", *COMMON, "--strategy", PLUGIN, *TOKENS, "--rate", "20", "--duration", "2",
               "--out", str(tmp_path / "live"), cwd=tmp_path)
    assert_token_budget_ran(tmp_path / "live")
    plugin_cli("simulate", *COMMON, "--strategy", PLUGIN, *TOKENS, "--rate", "20", "--duration", "2",
               "--out", str(tmp_path / "sim"), cwd=tmp_path)
    assert_token_budget_ran(tmp_path / "sim")


@pytest.mark.slow
def test_the_example_plugin_is_swept_by_name_with_its_parameters(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("base: {backend: sim, dataset: synthetic, duration_s: 1, max_new_tokens: 8, max_wait_ms: 500}\n"
                     "grid:\n  strategies:\n    - dynamic\n"
                     f"    - {{strategy: '{PLUGIN}', strategy_args: {{max_batch_tokens: 600}}}}\n  rates: [20]\n")
    for command in ("sweep", "simulate"):
        plugin_cli(command, str(sweep), "--out", str(tmp_path / command), cwd=tmp_path)
        assert_token_budget_ran(tmp_path / command / point_dir("token_budget", 20, 0))
