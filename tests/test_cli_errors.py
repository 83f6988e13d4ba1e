"""A user's mistake (bad setting, model, folder or port) is one `error:` line on stderr and exit 1."""
import os
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from batchlab.protocol.settings import ConfigError, build_config
from batchlab.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()


def batchlab(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`python -m cli.main ARGS` offline (no hub lookups), output captured."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "batchlab.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def assert_one_error_line(returncode: int, stderr: str, *needles: str) -> None:
    """Exit 1, and stderr is exactly one `error:` line holding every needle."""
    assert returncode == 1, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.slow  # loads transformers in a CLI process
def test_a_model_path_without_a_tokenizer_is_one_line(tmp_path):
    model = str(tmp_path / "no-such-model")
    proc = batchlab("run", "--backend", "sim", "--model", model, "--duration", "1", "--out", str(tmp_path / "out"))
    assert_one_error_line(proc.returncode, proc.stderr, model)


def test_an_out_folder_that_cannot_be_created_is_one_line(tmp_path):
    proc = batchlab("run", "--backend", "sim", "--dataset", "synthetic", "--duration", "1",
                    "--out", "/proc/batchlab-test/out")
    assert_one_error_line(proc.returncode, proc.stderr, "/proc/batchlab-test")


def test_a_port_in_use_is_one_line_not_a_hang(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        proc = batchlab("collector", "--address", address, "--out", str(tmp_path), timeout_s=60)
    assert_one_error_line(proc.returncode, proc.stderr, "Address already in use")


def test_a_string_rate_in_the_yaml_is_refused_naming_the_setting(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text('rate: "10"\n')
    result = runner.invoke(app, ["run", "--config", str(config), "--out", str(tmp_path / "out")])
    assert_one_error_line(result.exit_code, result.stderr, "rate", "'10'")


@pytest.mark.parametrize("name, value", [("rate", "10"), ("workers", True), ("workers", 2.0), ("seed", "0"),
                                         ("strict_memory", "yes"), ("model", 7), ("extra", ["a"]),
                                         ("strategy_args", 5)])
def test_a_value_of_the_wrong_type_is_a_config_error_naming_it(name, value):
    with pytest.raises(ConfigError, match=f"setting {name} must be"):
        build_config({name: value}, {})


def test_a_strategy_parameter_of_the_wrong_type_in_the_yaml_is_one_line_naming_it(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("strategy: naive\nstrategy_args: {batch_size: many}\n")
    result = runner.invoke(app, ["run", "--config", str(config), "--out", str(tmp_path / "out")])
    assert_one_error_line(result.exit_code, result.stderr, "batch_size must be an integer", "'many'")


def test_an_int_is_a_fine_float_and_becomes_one():
    cfg = build_config({"rate": 5, "max_wait_ms": 0}, {"duration_s": 2})
    assert (cfg.rate, cfg.max_wait_ms, cfg.duration_s) == (5.0, 0.0, 2.0)
    assert type(cfg.rate) is float and type(cfg.duration_s) is float


def test_a_null_in_the_yaml_keeps_the_default():
    assert build_config({"seed": None}, {}).seed == 0


def test_an_error_no_input_explains_is_shown_as_a_bug_with_its_traceback(monkeypatch, tmp_path):
    """Only a BatchlabError is a user's one line; a KeyError (or a stray ValueError, OSError) is batchlab's bug."""
    from batchlab.cli.main import BUG_EXIT

    for error in (KeyError("a bug"), ValueError("a bug"), OSError("a bug")):
        def crash(*_args, error=error):
            raise error

        monkeypatch.setattr("batchlab.runner.roles.collector_role", crash)
        result = runner.invoke(app, ["collector", "--out", str(tmp_path / type(error).__name__)])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == BUG_EXIT and lines[0] == "Traceback (most recent call last):", result.stderr
        assert lines[-1].startswith(f"error: a bug in batchlab ({type(error).__name__}: ")


def test_keyboard_interrupt_is_not_turned_into_an_error_line(monkeypatch, tmp_path):
    def interrupted(*_args):
        raise KeyboardInterrupt

    monkeypatch.setattr("batchlab.runner.roles.collector_role", interrupted)
    result = runner.invoke(app, ["collector", "--out", str(tmp_path)])
    assert result.exit_code == 130 and "error:" not in result.output  # typer's own handling of Ctrl-C


def test_importing_or_running_the_cli_leaves_the_callers_sigterm_handler_as_it_was():
    """Only while a command runs is a SIGTERM a Ctrl-C (exit 143); a process that imports the CLI, or runs
    a command in-process (a test), gets its own handler back."""
    import signal

    from typer.testing import CliRunner

    import batchlab.cli.main as cli_main

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert CliRunner().invoke(cli_main.app, ["--version"]).exit_code == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.fixture
def nothing_launched(monkeypatch):
    """`run` must refuse before any process starts: launching fails the test."""
    def launched(*_args, **_kwargs):
        raise AssertionError("a run was launched before its checks")

    monkeypatch.setattr("batchlab.runner.launcher.launch_run", launched)  # what batchlab.api.run calls


def long_temp_folder(tmp_path) -> str:
    """A temp folder whose run sockets' paths exceed the OS's 107 bytes (135 characters, as TMPDIR)."""
    folder = tmp_path / ("t" * (135 - len(str(tmp_path)) - 1))
    folder.mkdir()
    return str(folder)


@pytest.mark.parametrize("case, needles", [
    ("keys", ["--keys /nonexistent: no such folder"]),
    ("tmpdir", ["is too long for the run's sockets", "over the OS's limit of 107", "TMPDIR"]),
    ("result-folder", ["--save-result", "is a folder; name a file"]),
    ("result-unwritable", ["--save-result /proc/batchlab-test/r.json: no file can be created in /proc"]),
])
def test_what_a_run_needs_beyond_its_settings_is_checked_before_any_role_starts(tmp_path, monkeypatch,
                                                                              nothing_launched, case, needles):
    import tempfile

    args = ["run", "--backend", "sim", "--dataset", "synthetic", "--duration", "1", "--out", str(tmp_path / "out")]
    if case == "keys":
        args += ["--keys", "/nonexistent"]
    elif case == "tmpdir":
        monkeypatch.setattr(tempfile, "tempdir", long_temp_folder(tmp_path))
    elif case == "result-folder":
        args += ["--save-result", str(tmp_path)]
    else:
        args += ["--save-result", "/proc/batchlab-test/r.json"]
    result = runner.invoke(app, args)
    assert_one_error_line(result.exit_code, result.stderr, *needles)
    assert not (tmp_path / "out").exists()


def test_a_key_folder_without_its_keys_is_refused_naming_what_it_lacks(tmp_path, nothing_launched):
    from batchlab.protocol.security import generate_keys

    keys = generate_keys(tmp_path / "keys")
    (keys / "client.key_secret").unlink()
    result = runner.invoke(app, ["run", "--backend", "sim", "--keys", str(keys), "--out", str(tmp_path / "out")])
    assert_one_error_line(result.exit_code, result.stderr, "lacks client.key_secret", "batchlab keys generate")


def test_a_stream_whose_reader_left_drops_what_follows_and_points_at_dev_null():
    from batchlab.cli.streams import ReaderSafe

    read, write = os.pipe()
    stream = os.fdopen(write, "w")
    os.close(read)  # the reader left (head -c 1)
    safe = ReaderSafe(stream)
    assert safe.write("a table") == 7
    safe.flush()  # EPIPE: from here on the stream is /dev/null's
    assert safe.gone and safe.write("more") == 4
    assert os.path.samefile(f"/proc/self/fd/{stream.fileno()}", os.devnull)
    stream.close()  # its buffered rest goes to /dev/null: no BrokenPipeError at exit


def test_another_error_of_a_stream_is_not_taken_for_a_reader_that_left():
    from batchlab.cli.streams import ReaderSafe

    class Full:
        def write(self, _text):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        ReaderSafe(Full()).write("x")
