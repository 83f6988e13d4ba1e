"""Every setting is checked before start: NaN and infinities, negative sizes, an empty --out, absurd ints,
a batch whose Dispatch would pass the frame limit, a trace with only its header, a plugin that fails to
import or to build. Each is one `error:` line, exit 1, no traceback and no run folder."""
import os

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from tests.test_cli_errors import assert_one_error_line

runner = CliRunner()
SIM = ["--backend", "sim", "--dataset", "synthetic", "--duration", "1"]


def run_cli(tmp_path, *args: str):
    """`batchlab run ARGS` in-process, its folder under tmp_path; returns the result."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", *SIM, "--out", str(out), *args])
    assert not out.exists(), "a refused run must leave no folder"
    return result


@pytest.mark.parametrize("args, needles", [
    (["--memory-budget", "inf"], ["'inf'", "finite"]),
    (["--memory-budget", "1e400"], ["'1e400'", "finite"]),
    (["--memory-budget", "nan"], ["'nan'"]),
    (["--strategy-arg", "max_wait_ms=nan"], ["max_wait_ms", "finite"]),
    (["--strategy-arg", "max_wait_ms=inf"], ["max_wait_ms", "finite"]),
    (["--strategy", "sjf", "--strategy-arg", "noise=nan"], ["noise", "finite"]),
    (["--max-wait-ms", "nan"], ["--max-wait-ms", "finite"]),
    (["--rate", "nan"], ["--rate", "finite"]),
    (["--duration", "inf"], ["--duration"]),
    (["--max-queue", "-1"], ["--max-queue", "≥ 0"]),
    (["--max-queue-tokens", "-5"], ["--max-queue-tokens", "≥ 0"]),
    (["--max-prompt-len", "0"], ["--max-prompt-len", "≥ 1"]),
    (["--seed", "-1"], ["--seed", "≥ 0"]),
    (["--gpu-memory-utilization", "0"], ["--gpu-memory-utilization"]),
    (["--max-batch-size", str(2**70)], ["--max-batch-size", str(2**70)]),
    (["--max-batch-size", str(2**21)], ["--max-batch-size", str(2**20)]),
    (["--dtype", "bogus"], ["--dtype must be one of auto, float32, float16, bfloat16, got 'bogus'"]),  # sim ran it
    (["--strategy", "naive", "--batch-size", "1100", "--prompt-lengths", "16000", "--max-prompt-len", "16384"],
     ["1100 rows", "16384 prompt tokens", "64 MiB frame limit"]),
])
def test_a_bad_number_is_one_line_before_anything_starts(tmp_path, args, needles):
    result = run_cli(tmp_path, *args)
    assert_one_error_line(result.exit_code, result.stderr, *needles)


def test_an_empty_out_folder_is_refused_rather_than_writing_into_the_current_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", *SIM, "--out", ""])
    assert_one_error_line(result.exit_code, result.stderr, "--out")
    assert os.listdir(tmp_path) == []


def test_a_continuous_strategy_sends_one_request_per_batch_so_many_rows_of_long_prompts_are_fine():
    from batchlab.runner.preflight import checked_config
    cfg = checked_config({"strategy": "continuous", "max_batch_size": 1100, "max_prompt_len": 16384}, {})
    assert cfg.max_batch_size == 1100


def test_a_trace_with_only_its_header_is_one_line(tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text("timestamp,input_len,output_len\n")
    result = run_cli(tmp_path, "--dataset", f"trace:{trace}", "--arrival", "trace")
    assert_one_error_line(result.exit_code, result.stderr, str(trace), "no records")


PLUGINS = {
    "raises_at_import": "raise RuntimeError('no GPU here')\n",
    "bad_syntax": "class Broken(:\n",
    "imports_missing": "import batchlab_no_such_module\n",
    "raises_when_built": (
        "class Policy:\n    name = 'boom'\n    mode = 'static'\n\n    def __init__(self):\n"
        "        raise RuntimeError('cannot build')\n\n    def decide(self, *a):\n        pass\n\n"
        "    def on_batch_done(self, *a):\n        pass\n"),
}


@pytest.mark.parametrize("module, needles", [
    ("raises_at_import", ["raises_at_import:Policy", "RuntimeError: no GPU here"]),
    ("bad_syntax", ["bad_syntax:Policy", "SyntaxError"]),
    ("imports_missing", ["imports_missing:Policy", "batchlab_no_such_module"]),
    ("raises_when_built", ["strategy boom", "RuntimeError: cannot build"]),
])
def test_a_plugin_that_fails_to_import_or_to_build_is_one_line(tmp_path, monkeypatch, module, needles):
    (tmp_path / f"{module}.py").write_text(PLUGINS[module])
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run_cli(tmp_path, "--strategy", f"{module}:Policy")
    assert_one_error_line(result.exit_code, result.stderr, *needles)
