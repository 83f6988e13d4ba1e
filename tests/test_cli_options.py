"""Every option is generated from a settings field: one option per field, each role command takes its
group's, --help lists them by group, and a wrong name is refused naming the close ones."""
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.cli.options import CLI_FIELDS
from batchlab.protocol.setting_groups import (BACKEND_GROUPS, CollectorSettings, SchedulerSettings, TrafficSettings,
                                              WorkerSettings)
from batchlab.protocol.settings import ConfigError, RunConfig, build_config

COMMANDS = get_command(app).commands


def setting_params(command: str) -> dict[str, list[str]]:
    """The command's options that set a RunConfig field: field name → its flags."""
    return {p.name: p.opts for p in COMMANDS[command].params if p.name in RunConfig.model_fields}


def test_run_has_exactly_one_option_per_command_line_field_and_none_for_the_others():
    params = [p.name for p in COMMANDS["run"].params if p.name in RunConfig.model_fields]
    assert sorted(params) == sorted(CLI_FIELDS)
    assert set(RunConfig.model_fields) - set(CLI_FIELDS) == {"label", "repeat", "extra", "strategy_sha256"}
    flags = [flag for opts in setting_params("run").values() for flag in opts]
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize("command, groups", [("traffic", [TrafficSettings]), ("scheduler", [SchedulerSettings]),
                                             ("worker", [WorkerSettings, *BACKEND_GROUPS]),
                                             ("collector", [CollectorSettings])])
def test_each_role_command_takes_its_groups_options(command, groups):
    given = setting_params(command)
    for group in groups:
        assert set(group.model_fields) & set(CLI_FIELDS) <= set(given), group.__name__


@pytest.mark.parametrize("name, flag", [("duration_s", "--duration"), ("trace_start_s", "--trace-start"),
                                        ("strategy_args", "--strategy-arg"), ("think_time_ms", "--think-time-ms"),
                                        ("strict_memory", "--strict-memory"), ("max_num_seqs", "--max-num-seqs")])
def test_the_documented_flag_spellings_stay(name, flag):
    assert setting_params("run")[name][0] == flag


def test_run_help_lists_the_options_by_group_with_their_units():
    text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"}).output
    for panel in ("Traffic", "Scheduler", "Worker", "Collector"):
        assert f"─ {panel} ─" in text
    assert "dynamic: age trigger (ms)" in text


@pytest.mark.parametrize("given, needles", [({"rat": 3}, ["unknown setting(s): rat", "did you mean", "rate"]),
                                            ({"max_wait": 3}, ["max_wait_ms"])])
def test_an_unknown_setting_is_refused_naming_the_close_ones(given, needles):
    with pytest.raises(ConfigError) as error:
        build_config(given, {})
    assert all(n in str(error.value) for n in needles)


def test_a_bound_is_refused_with_the_setting_its_unit_and_the_value_in_the_callers_vocabulary():
    """From Python the setting's Python name; inside a command (cli.main sets that vocabulary) its option."""
    from batchlab.protocol.errors import command_line_vocabulary

    with pytest.raises(ConfigError, match=r"^max_queue must be ≥ 0 requests \(0: unbounded\), got -1$"):
        build_config({"max_queue": -1}, {})
    with command_line_vocabulary(), pytest.raises(ConfigError, match=r"^--max-queue must be ≥ 0 requests \(0: "
                                                                     r"unbounded\), got -1$"):
        build_config({"max_queue": -1}, {})
    with pytest.raises(ConfigError, match=r"^duration_s must be > 0 s, got 0"):  # a declared flag: --duration
        build_config({"duration_s": 0}, {})
    result = CliRunner().invoke(app, ["run", "--duration", "0"])
    assert result.exit_code == 1 and result.stderr.strip() == "error: --duration must be > 0 s, got 0.0"


@pytest.mark.parametrize("args, line", [
    (["run", "--rate", "abc"], "error: Invalid value for '--rate': Input should be a valid number, unable to parse "
                               "string as a number (see 'batchlab run --help')"),
    (["run", "--zzz", "1"], "error: No such option: --zzz (see 'batchlab run --help')"),
    (["report"], "error: Missing argument 'folder'. (see 'batchlab report --help')"),
    (["nosuchcommand"], "error: No such command 'nosuchcommand'. (see 'batchlab --help')"),
    (["--zzz"], "error: No such option: --zzz (see 'batchlab --help')"),
])
def test_a_usage_error_is_bad_input_one_line_and_exit_1(args, line):
    """docs/faults.md: bad input exits 1 with one line, whether pydantic or click finds it (click's boxed
    message and its exit 2 read as a fault)."""
    result = CliRunner().invoke(app, args, prog_name="batchlab")
    assert result.exit_code == 1 and result.output.strip().splitlines() == [line], result.output
