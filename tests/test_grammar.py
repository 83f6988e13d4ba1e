"""One settings grammar: SLO comma lists everywhere, <bool> flags take true/false, --version, sweep --set."""
import json
import time
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab import api
from batchlab.runner.preflight import checked_config
from batchlab.cli.grammar import bool_words
from batchlab.cli.main import BUG_EXIT, app
from batchlab.lab.sweep_plan import SweepError, load_plan, parse_sets
from batchlab.protocol.settings import parse_slos
from typer.main import get_command
from tests.summaries import make_summary

runner = CliRunner()
SWEEP = "base: {dataset: synthetic, duration_s: 3}\ngrid: {strategies: [naive, dynamic], rates: [4], repeats: 1}\n"


def test_an_slo_comma_list_is_the_same_as_repeated_options():
    assert parse_slos(["ttft=1s,tpot=50ms"]) == parse_slos(["ttft=1s", "tpot=50ms"]) == {"ttft": 1.0, "tpot": 0.05}
    assert checked_config({}, {"slo": ["ttft=1s,tpot=50ms"]}).slo == ["ttft=1s", "tpot=50ms"]
    assert checked_config({"slo": "e2e=2s, ttft=300"}, {}).slos() == {"e2e": 2.0, "ttft": 0.3}


def test_simulate_reads_an_slo_comma_list_into_goodput(tmp_path):
    result = runner.invoke(app, ["simulate", "--slo", "ttft=1s,tpot=50ms", "--duration", "2", "--dataset",
                                 "synthetic", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "summary.json").read_text())["settings"]
    assert settings["slo"] == ["ttft=1s", "tpot=50ms"]


@pytest.mark.parametrize("command", ["run", "simulate", "report", "tune"])
def test_every_command_names_the_default_slo_unit_in_help(command):
    slo = next(p for p in get_command(app).commands[command].params if p.name == "slo")
    assert "without a unit is in ms" in slo.help and "comma list" in slo.help


@pytest.mark.parametrize("words,expected", [
    (["--strict-memory", "true"], ["--strict-memory"]), (["--strict-memory", "False"], ["--no-strict-memory"]),
    (["--enforce-eager=yes"], ["--enforce-eager"]), (["--torch-compile", "0"], ["--no-torch-compile"]),
    (["--strict-memory", "--rate", "3"], ["--strict-memory", "--rate", "3"]),
])
def test_a_bool_flag_takes_a_true_or_false_word(words, expected):
    assert bool_words(get_command(app), ["run", *words]) == ["run", *expected]


def test_a_bool_word_reaches_the_run_config(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr("batchlab.api.run", lambda cfg, **_kw: seen.setdefault("cfg", cfg) and make_summary())
    monkeypatch.setattr("batchlab.cli.result_table.show", lambda summary, out: None)
    result = runner.invoke(app, ["run", "--backend", "vllm", "--strict-memory", "true", "--enforce-eager", "false",
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert seen["cfg"].strict_memory is True and seen["cfg"].enforce_eager is False


def test_a_strategy_arg_bool_takes_true_and_false():
    on = checked_config({"slo": ["ttft=500ms"]}, {"strategy": "edf", "strategy_args": ["reject_late=true"]})
    off = checked_config({"slo": ["ttft=500ms"]}, {"strategy": "edf", "strategy_args": ["reject_late=False"]})
    assert on.strategy_args["reject_late"] is True and off.strategy_args["reject_late"] is False


def test_version_prints_the_installed_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"batchlab {metadata.version('batchlab')}"


def test_sweep_set_overrides_base_and_grid_keys(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP)
    plan = load_plan(config, parse_sets(["duration_s=1.5", "base.seed=4", "grid.repeats=2", "grid.rates=[2, 8]"]))
    assert plan.base["duration_s"] == 1.5 and plan.base["seed"] == 4
    assert plan.repeats == 2 and plan.rates == [2.0, 8.0]


def test_a_bad_sweep_set_is_one_line_and_exit_1(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP)
    for item, words in (("duration_s", "KEY=VALUE"), ("not_a_setting=3", "unknown setting"),
                        ("other.x=1", "grid. or base.")):
        result = runner.invoke(app, ["sweep", str(config), "--set", item, "--out", str(tmp_path / "o")])
        assert result.exit_code == 1 and words in result.output, result.output
    with pytest.raises(SweepError):
        parse_sets(["=3"])


def test_sweep_passes_its_sets_to_the_sweep(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(api, "sweep", lambda config, out, on_progress, **kw: calls.append(kw) or
                        api.SweepResult(Path(out), []))
    runner.invoke(app, ["sweep", "x.yaml", "--set", "duration_s=2", "--set", "grid.repeats=3",
                        "--out", str(tmp_path)])
    assert calls == [{"resume": True, "duration_s": 2, "grid.repeats": 3, "ray": None, "save_result": None}]


def test_a_ctrl_c_inside_a_c_extensions_import_is_interrupted_not_a_traceback(tmp_path, monkeypatch):
    """CPython wraps a KeyboardInterrupt raised while a C extension initialises (a command's lazy pandas
    import) in a SystemError: still a Ctrl-C, exit 130; any other SystemError stays a bug with its traceback."""
    from typer.testing import CliRunner

    from batchlab import api

    def interrupted(*_a, **_k):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError("<class 'pandas.x'> returned a result with an exception set") from exc

    monkeypatch.setattr(api, "report", interrupted)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 130 and "error: interrupted" in result.output
    monkeypatch.setattr(api, "report", lambda *_a, **_k: (_ for _ in ()).throw(SystemError("a bug")))
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == BUG_EXIT and "SystemError: a bug" in result.output


def test_a_ctrl_c_that_surfaces_as_another_error_is_interrupted(tmp_path, monkeypatch):
    """A Ctrl-C that cut a lazy import short can leave a half-initialised module whose next use raises
    AttributeError (a fresh-clone fault matrix: 'partially initialized module pandas has no attribute
    plotting', a traceback and exit 1). A signal that came while the command ran makes any such error the
    stop: Ctrl-C 130, SIGTERM 143; without one, the same error stays a bug with its traceback."""
    import os
    import signal

    from typer.testing import CliRunner

    from batchlab import api

    def cut_short(signum):
        def report(*_a, **_k):
            try:
                os.kill(os.getpid(), signum)
                time.sleep(1)  # the handler runs here
            except KeyboardInterrupt:
                pass  # what an import machinery or a library may do with it
            raise AttributeError("partially initialized module 'pandas' has no attribute 'plotting'")
        return report

    before = {sig: signal.signal(sig, handler)  # Python's own, whatever the suite inherited
              for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))}
    try:
        for signum, code, line in ((signal.SIGINT, 130, "error: interrupted"),
                                   (signal.SIGTERM, 143, "error: terminated")):
            monkeypatch.setattr(api, "report", cut_short(signum))
            result = CliRunner().invoke(app, ["report", str(tmp_path)])
            assert result.exit_code == code and line in result.output, result.output
        monkeypatch.setattr(api, "report", lambda *_a, **_k: (_ for _ in ()).throw(AttributeError("a bug")))
        result = CliRunner().invoke(app, ["report", str(tmp_path)])
        assert result.exit_code == BUG_EXIT and "AttributeError: a bug" in result.output
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
