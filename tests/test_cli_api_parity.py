"""The command line and batchlab.api refuse the same input the same way: every bad input the CLI's tests feed
(tests/test_cli_errors.py, test_setting_errors.py, test_e2e_sim.py, test_closed_loop_e2e.py, test_vllm_result.py,
test_run_identity.py, test_backend_plugins.py, test_strategy_plugins.py, test_capacity.py, test_study_settings.py,
test_api.py, test_grammar.py, test_load_stops.py, test_simulator_cli.py, test_sim_presets.py, test_tune.py,
test_calibrate_runs.py) is fed through the API too, and both raise the same BatchlabError class with the same
message; from Python the message names the setting by its Python name, inside a command by its option (one
rule: protocol.errors.term).

Left out, having no API form: the command line's own grammar (`--rate abc`, an unknown option, `--set KEY`
without `=`), and the inputs a command reads back from a run (report --extra, an older sweep layout).
"""
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import batchlab.cli.main as cli_main
from batchlab import api
from batchlab.protocol.errors import BatchlabError, command_line_vocabulary
from tests.test_cli_errors import long_temp_folder
from tests.test_setting_errors import PLUGINS
from tests.test_sim_presets import GRID as PRESETS_GRID  # a grid of the three kinds the presets separate

runner = CliRunner()
SIM = {"backend": "sim", "dataset": "synthetic", "duration_s": 1.0}
SIM_ARGS = ["--backend", "sim", "--dataset", "synthetic", "--duration", "1"]
GRID = "base: {backend: sim, dataset: synthetic, duration_s: 1}\ngrid: {strategies: [naive, dynamic], rates: [4]}\n"
NAN, INF = float("nan"), float("inf")


class Case:
    """One bad input: its command line, its API call (both given the test's folder), and the setting it names."""

    def __init__(self, args: Callable[[Path], list[str]], call: Callable[[Path], object], python: str = "",
                 flag: str = "") -> None:
        self.args, self.call, self.python, self.flag = args, call, python, flag


def run_case(cli: list[str], python: str, flag: str, **changes) -> Case:
    """`batchlab run` with SIM, options `cli`; api.run with SIM and `changes` (out: the test's folder's out)."""
    return Case(lambda tmp: ["run", *SIM_ARGS, "--out", str(tmp / "out"), *cli],
                lambda tmp: api.run({**SIM}, tmp / "out", **changes), python, flag)


def grid_file(tmp: Path, text: str = GRID) -> str:
    path = tmp / "grid.yaml"
    path.write_text(text)
    return str(path)


def capacity_case(cli: list[str], python: str, flag: str, simulated: bool = True, **changes) -> Case:
    """`batchlab capacity GRID [--simulate]` with options `cli`; api.capacity with `changes`."""
    mode = ["--simulate"] if simulated else ["--out", "{out}"]
    return Case(lambda tmp: ["capacity", grid_file(tmp), *[m.format(out=tmp / "cap") for m in mode], *cli],
                lambda tmp: api.capacity(grid_file(tmp), None if simulated else tmp / "cap", simulated=simulated,
                                         **changes), python, flag)


def used_folder(tmp: Path) -> Path:
    (tmp / "out").mkdir(exist_ok=True)
    (tmp / "out" / "summary.json").write_text("{}")
    return tmp / "out"


def empty_trace(tmp: Path) -> str:
    (tmp / "empty.csv").write_text("timestamp,input_len,output_len\n")
    return f"trace:{tmp / 'empty.csv'}"


CASES = {
    # a run's settings (test_setting_errors, test_e2e_sim, test_cli_options, test_closed_loop_e2e)
    "concurrency-0": run_case(["--concurrency", "0"], "concurrency", "--concurrency", concurrency=0),
    "concurrency-beside-rate": run_case(["--concurrency", "4", "--rate", "5"], "concurrency", "--concurrency",
                                        concurrency=4, rate=5.0),
    "duration-0": run_case(["--duration", "0"], "duration_s", "--duration", duration_s=0.0),
    "duration-inf": run_case(["--duration", "inf"], "duration_s", "--duration", duration_s=INF),
    "rate-0": run_case(["--rate", "0"], "rate", "--rate", rate=0.0),
    "rate-nan": run_case(["--rate", "nan"], "rate", "--rate", rate=NAN),
    "memory-budget-inf": run_case(["--memory-budget", "inf"], "", "", memory_budget="inf"),
    "memory-budget-1e400": run_case(["--memory-budget", "1e400"], "", "", memory_budget="1e400"),
    "memory-budget-nan": run_case(["--memory-budget", "nan"], "", "", memory_budget="nan"),
    "memory-budget-lots": run_case(["--memory-budget", "lots"], "", "", memory_budget="lots"),
    "strategy-arg-nan": run_case(["--strategy-arg", "max_wait_ms=nan"], "", "", strategy_args=["max_wait_ms=nan"]),
    "strategy-arg-inf": run_case(["--strategy-arg", "max_wait_ms=inf"], "", "", strategy_args=["max_wait_ms=inf"]),
    "sjf-noise-nan": run_case(["--strategy", "sjf", "--strategy-arg", "noise=nan"], "", "", strategy="sjf",
                              strategy_args=["noise=nan"]),
    "max-wait-nan": run_case(["--max-wait-ms", "nan"], "max_wait_ms", "--max-wait-ms", max_wait_ms=NAN),
    "max-queue": run_case(["--max-queue", "-1"], "max_queue", "--max-queue", max_queue=-1),
    "max-queue-tokens": run_case(["--max-queue-tokens", "-5"], "max_queue_tokens", "--max-queue-tokens",
                                 max_queue_tokens=-5),
    "max-prompt-len": run_case(["--max-prompt-len", "0"], "max_prompt_len", "--max-prompt-len", max_prompt_len=0),
    "seed": run_case(["--seed", "-1"], "seed", "--seed", seed=-1),
    "gpu-memory-utilization": run_case(["--gpu-memory-utilization", "0"], "gpu_memory_utilization",
                                       "--gpu-memory-utilization", gpu_memory_utilization=0.0),
    "max-batch-size-2**70": run_case(["--max-batch-size", str(2**70)], "max_batch_size", "--max-batch-size",
                                     max_batch_size=2**70),
    "max-batch-size-2**21": run_case(["--max-batch-size", str(2**21)], "max_batch_size", "--max-batch-size",
                                     max_batch_size=2**21),
    "dtype": run_case(["--dtype", "bogus"], "dtype", "--dtype", dtype="bogus"),
    "frame-limit": run_case(["--strategy", "naive", "--batch-size", "1100", "--prompt-lengths", "16000",
                             "--max-prompt-len", "16384"], "batch_size", "--batch-size", strategy="naive",
                            batch_size=1100, prompt_lengths="16000", max_prompt_len=16384),
    "unknown-strategy": run_case(["--strategy", "fastest"], "", "", strategy="fastest"),
    "naive-has-no-max-wait": run_case(["--strategy", "naive", "--strategy-arg", "max_wait_ms=5"], "", "",
                                      strategy="naive", strategy_args=["max_wait_ms=5"]),
    "dynamic-has-no-size": run_case(["--strategy", "dynamic", "--strategy-arg", "size=4"], "", "",
                                    strategy="dynamic", strategy_args=["size=4"]),
    "plugin-backend": run_case(["--backend", "no_such_module:Backend"], "", "", backend="no_such_module:Backend"),
    # settings the backend ignores, what a run needs beyond its settings (test_vllm_result, test_cli_errors)
    "ignored-max-concurrency": run_case(["--max-concurrency", "2"], "max_concurrency", "--max-concurrency",
                                        max_concurrency=2),
    "ignored-endpoint": run_case(["--endpoint", "http://x/v1"], "endpoint", "--endpoint", endpoint="http://x/v1"),
    "ignored-warmup": run_case(["--warmup-requests", "1"], "warmup_requests", "--warmup-requests",
                               warmup_requests=1),
    "keys": run_case(["--keys", "/nonexistent"], "keys", "--keys", keys="/nonexistent"),
    "sim-preset": run_case(["--preset", "nosuch"], "preset", "--preset", preset="nosuch"),
    "model-offline": run_case(["--backend", "hf", "--model", "no/such-model"], "model", "--model", backend="hf",
                              model="no/such-model"),
    "model-folder": run_case(["--backend", "hf", "--model", "./no/such/folder"], "model", "--model", backend="hf",
                             model="./no/such/folder"),
    "model-arch": run_case(["--backend", "hf", "--model", "nosuch:random"], "model", "--model", backend="hf",
                           model="nosuch:random"),
    "save-result-unwritable": run_case(["--save-result", "/proc/batchlab-test/r.json"], "save_result",
                                       "--save-result", save_result="/proc/batchlab-test/r.json"),
    "save-result-folder": Case(lambda tmp: ["run", *SIM_ARGS, "--out", str(tmp / "out"), "--save-result", str(tmp)],
                               lambda tmp: api.run(SIM, tmp / "out", save_result=tmp), "save_result",
                               "--save-result"),
    "config-missing": Case(lambda tmp: ["run", "--config", "/nonexistent.yaml"],
                           lambda tmp: api.run("/nonexistent.yaml")),
    "out-empty": Case(lambda tmp: ["run", *SIM_ARGS, "--out", ""], lambda tmp: api.run(SIM, ""), "out", "--out"),
    "out-used": Case(lambda tmp: ["run", *SIM_ARGS, "--out", str(used_folder(tmp))],
                     lambda tmp: api.run(SIM, used_folder(tmp))),
    "trace-header-only": Case(lambda tmp: ["run", *SIM_ARGS, "--out", str(tmp / "out"), "--dataset",
                                           empty_trace(tmp), "--arrival", "trace"],
                              lambda tmp: api.run(SIM, tmp / "out", dataset=empty_trace(tmp), arrival="trace")),
    # a strategy plugin that fails to import or to build (test_setting_errors)
    **{f"plugin-{name}": run_case(["--strategy", f"{name}:Policy"], "", "", strategy=f"{name}:Policy")
       for name in PLUGINS},
    # a capacity search (test_capacity, test_study_settings)
    "capacity-unknown-strategy": capacity_case(["--strategy", "nope"], "strategies", "--strategy",
                                               strategies=["nope"]),
    "capacity-max-probes": capacity_case(["--max-probes", "0"], "max_probes", "--max-probes", max_probes=0),
    **{f"capacity-{name}-{mode}": capacity_case([flag, text], name, flag, simulated=mode == "simulated",
                                                **{name: value})
       for flag, text, name, value in (("--search-requests", "1000000000000", "search_requests", 10**12),
                                       ("--duration", "1e12", "search_duration_s", 1e12),
                                       ("--saturated-s", "inf", "saturated_duration_s", INF))
       for mode in ("simulated", "live")},
    # a sweep (test_api, test_grammar)
    "sweep-ray-cpus": Case(lambda tmp: ["sweep", grid_file(tmp), "--out", str(tmp / "sweep"), "--ray",
                                        "--ray-cpus", "-1"],
                           lambda tmp: api.sweep(grid_file(tmp), tmp / "sweep", ray={"address": "local", "cpus": -1.0}),
                           "cpus", "--ray-cpus"),
    "sweep-unknown-setting": Case(lambda tmp: ["sweep", grid_file(tmp), "--out", str(tmp / "sweep"), "--set",
                                               "not_a_setting=3"],
                                  lambda tmp: api.sweep(grid_file(tmp), tmp / "sweep", not_a_setting=3)),
    "sweep-dotted-key": Case(lambda tmp: ["sweep", grid_file(tmp), "--out", str(tmp / "sweep"), "--set", "other.x=1"],
                             lambda tmp: api.sweep(grid_file(tmp), tmp / "sweep", **{"other.x": 1})),
    # simulate (test_load_stops, test_simulator_cli, test_sim_presets)
    "simulate-negative-count": Case(lambda tmp: ["simulate", "--num-requests", "-3", "--out", str(tmp / "sim")],
                                    lambda tmp: api.simulate(None, tmp / "sim", num_requests=-3),
                                    "num_requests", "--num-requests"),
    "simulate-concurrency-0": Case(lambda tmp: ["simulate", "--concurrency", "0", "--out", str(tmp / "sim")],
                                   lambda tmp: api.simulate(None, tmp / "sim", concurrency=0)),
    "simulate-unknown-preset": Case(lambda tmp: ["simulate", "--preset", "h100-imaginary", "--out", str(tmp / "sim")],
                                    lambda tmp: api.simulate(None, tmp / "sim", preset="h100-imaginary"),
                                    "preset", "--preset"),
    "simulate-one-preset-for-three-backends": Case(
        lambda tmp: ["simulate", grid_file(tmp, PRESETS_GRID), "--preset", "cpu-tiny-mistral", "--out",
                     str(tmp / "sim")],
        lambda tmp: api.simulate(grid_file(tmp, PRESETS_GRID), tmp / "sim", preset="cpu-tiny-mistral")),
    # report (its options as a sweep's or a run's folder takes them)
    "report-bad-slo": Case(lambda tmp: ["report", str(tmp), "--slo", "speed=1s"],
                           lambda tmp: api.report(tmp, slos=["speed=1s"])),
    "report-rate-0": Case(lambda tmp: ["report", str(tmp), "--rate", "0"], lambda tmp: api.report(tmp, rate=0.0),
                          "rate", "--rate"),
    # tune and calibrate (test_tune, test_study_settings)
    "tune-without-slo": Case(lambda tmp: ["tune", "--out", str(tmp / "tune")],
                             lambda tmp: api.tune({}, tmp / "tune"), "slo", "--slo"),
    "tune-unknown-knob": Case(lambda tmp: ["tune", "--slo", "ttft=1s", "--grid", "rows=4", "--out", str(tmp / "t")],
                              lambda tmp: api.tune({}, tmp / "t", slo=["ttft=1s"], knobs=["rows=4"])),
    "tune-bad-slo": Case(lambda tmp: ["tune", "--slo", "speed=1s", "--out", str(tmp / "tune")],
                         lambda tmp: api.tune({}, tmp / "tune", slo=["speed=1s"]), "slo", "--slo"),
    "calibrate-from-no-runs": Case(lambda tmp: ["calibrate", "--from", str(tmp), "--out", str(tmp / "x.yaml")],
                                   lambda tmp: api.calibrate(out=tmp / "x.yaml", runs=[tmp])),
    "calibrate-weigh": Case(lambda tmp: ["calibrate", "--from", str(tmp), "--weigh", "tokens", "--out",
                                         str(tmp / "x.yaml")],
                            lambda tmp: api.calibrate(out=tmp / "x.yaml", runs=[tmp], weigh="tokens"), "weigh",
                            "--weigh"),
    "calibrate-sim": Case(lambda tmp: ["calibrate", "--backend", "sim"], lambda tmp: api.calibrate(backend="sim"),
                          "backend", "--backend"),
}


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every input here must be refused before anything starts: a launch or a search fails the test."""
    def started(*_args, **_kwargs):
        raise AssertionError("a run started before its checks")

    monkeypatch.setattr("batchlab.runner.launcher.launch_run", started)


def cli_error(monkeypatch, args: list[str]) -> tuple[type | None, str]:
    """The error class the command handed to its one `error:` line (None: a line of its own), and the line."""
    handed = []
    fail = cli_main._fail

    def recorded(error, code: int = 1):
        handed.append(error)
        fail(error, code)

    monkeypatch.setattr(cli_main, "_fail", recorded)
    result = runner.invoke(cli_main.app, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    kind = type(handed[-1]) if handed and isinstance(handed[-1], BaseException) else None
    return kind, lines[0].removeprefix("error: ")


def api_error(call: Callable[[], object]) -> BatchlabError:
    """The BatchlabError the API call raised."""
    with pytest.raises(BatchlabError) as caught:
        call()
    return caught.value


def one_line(text: object) -> str:
    return " ".join(str(text).split())


@pytest.mark.parametrize("name", CASES)
def test_the_cli_and_the_api_refuse_a_bad_input_with_the_same_class_and_message(name, tmp_path, monkeypatch,
                                                                               nothing_runs):
    case = CASES[name]
    monkeypatch.chdir(tmp_path)  # a default folder (results/...) stays in the test's own
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, text in PLUGINS.items():
        (tmp_path / f"{module}.py").write_text(text)
    cli_kind, line = cli_error(monkeypatch, case.args(tmp_path))
    with command_line_vocabulary():
        in_command = api_error(lambda: case.call(tmp_path))
    from_python = api_error(lambda: case.call(tmp_path))
    assert cli_kind is type(in_command) is type(from_python)
    assert one_line(in_command) == line
    if case.python:  # from Python the setting is named by its Python name, not its option
        assert case.python in str(from_python) and case.flag not in str(from_python), from_python


def test_a_long_temp_folder_is_refused_alike(tmp_path, monkeypatch, nothing_runs):
    """The run's sockets' folder (the preflight's): the same line from both."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", long_temp_folder(tmp_path))
    kind, line = cli_error(monkeypatch, ["run", *SIM_ARGS, "--out", str(tmp_path / "out")])
    error = api_error(lambda: api.run(SIM, tmp_path / "out"))
    assert kind is type(error) and one_line(error) == line
    assert not os.path.exists(tmp_path / "out")


def test_batchlab_run_checks_its_settings_once(tmp_path, monkeypatch):
    """The command builds the live view's settings with api.run_config and hands them to api.run, which takes
    them as checked (RunConfig.checked) rather than checking them again; a change made since is checked."""
    import batchlab.runner.preflight as preflight

    checks = []
    check = preflight.checked_config
    monkeypatch.setattr(preflight, "checked_config", lambda *a: checks.append(a) or check(*a))
    monkeypatch.setattr("batchlab.runner.launcher.launch_run", lambda *_a, **_k: (_ for _ in ()).throw(
        api.RunFailed("stopped here")))
    result = runner.invoke(cli_main.app, ["run", *SIM_ARGS, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "stopped here" in result.stderr, result.output
    assert len(checks) == 1
    cfg = api.run_config(SIM)
    cfg.rate = -1.0  # edited after its check: checked again, and refused
    with pytest.raises(api.ConfigError, match="rate"):
        api.run_config(cfg)
