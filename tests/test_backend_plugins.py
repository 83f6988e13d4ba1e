"""Backends as plugins, found as strategies are: a built-in name, an entry point or package.module:Class;
the Backend base class's defaults; the example plugin in examples/backends/ run live from outside the package."""
import json
import os
import subprocess
import sys
from importlib import metadata

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.runner.preflight import check_before_start
from batchlab.protocol.plugins import BACKEND_GROUP
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.worker.backend import Backend, BackendError, BackendInfo, BackendRequest
from batchlab.worker.factory import backend_class, make_backend
from tests.conftest import ROOT

EXAMPLES = ROOT / "examples" / "backends"
PLUGIN = "fixed_latency:FixedLatency"


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def rows(*output_lens: int) -> list[BackendRequest]:
    return [BackendRequest.new(i, 3, n, [1, 2, 3], 0) for i, n in enumerate(output_lens)]


class StaticOnly(Backend):
    """Whole batches only: no admit/step of its own."""

    modes = ("static",)

    def __init__(self, cfg=None, mode: str = "static", rows: int = 1) -> None:
        self.info = BackendInfo("static_only", "none", mode, rows, 0, 0)
        self.batches = 0

    def run_batch(self, rows, on_step) -> None:
        self.batches += 1


def test_a_plugin_by_module_path_runs_a_static_batch_through_the_base_run_batch(examples_on_path):
    backend = make_backend(RunConfig(backend=PLUGIN), "static", 4)
    outs = []
    backend.run_batch(rows(2, 3), outs.append)
    assert type(backend).__name__ == "FixedLatency" and backend.info.max_batch_size == 4
    assert [o.finished for o in outs] == [[], [0], [1]] and sum(len(o.token_ids) for o in outs) == 5
    assert not backend.has_work() and backend.run_facts() == {"steps": 3}


def test_an_entry_point_names_a_backend_and_the_mode_it_runs_is_checked(monkeypatch):
    point = metadata.EntryPoint("static_only", f"{__name__}:StaticOnly", BACKEND_GROUP)
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [point] if kw.get("group") == BACKEND_GROUP else real(**kw))
    assert RunConfig(backend="static_only").validate().backend == "static_only"  # the settings check knows it
    backend = make_backend(RunConfig(backend="static_only"), "static", 3)
    assert isinstance(backend, StaticOnly) and backend.max_rows == 3
    with pytest.raises(ConfigError, match="runs static batches, and the strategy needs continuous"):
        backend_class("static_only", "continuous")
    with pytest.raises(BackendError, match="static batches only"):
        backend.admit(rows(1))
    with pytest.raises(ConfigError, match="choose from sim, echo, hf, vllm, openai, static_only"):
        backend_class("early", "static")


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module:Backend", "cannot import no_such_module"),
    ("fixed_latency:NoSuchClass", "fixed_latency has no 'NoSuchClass'"),
    ("fixed_latency:VOCAB", "not a backend class"),
])
def test_a_bad_plugin_backend_is_a_config_error_before_anything_starts(examples_on_path, spec, needle):
    with pytest.raises(ConfigError, match=needle):
        check_before_start(RunConfig(backend=spec, dataset="synthetic"))


def test_a_bad_plugin_backend_on_the_command_line_is_one_line_and_no_folder(tmp_path):
    result = CliRunner().invoke(app, ["run", "--backend", "no_such_module:Backend", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1 and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines() == [
        "error: backend no_such_module:Backend: cannot import no_such_module (No module named 'no_such_module'; "
        "is it on PYTHONPATH?)"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["dynamic", "continuous"])
def test_the_example_backend_runs_live_from_outside_the_package(tmp_path, strategy):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES)}
    proc = subprocess.run([sys.executable, "-m", "batchlab.cli.main", "run", "--backend", PLUGIN, "--strategy",
                           strategy, "--dataset", "synthetic", "--max-new-tokens", "8", "--rate", "20",
                           "--duration", "1", "--seed", "3", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = pd.read_parquet(out / "requests.parquet")
    summary = json.loads((out / "summary.json").read_text())
    assert len(requests) > 0 and set(requests.status) == {"finished"}
    assert summary["settings"]["backend"] == PLUGIN
    assert [w["backend"] for w in summary["settings"]["workers"].values()] == ["fixed_latency"]
    assert [s["steps"] > 0 for s in summary["worker_stats"].values()] == [True]  # its run_facts, in the bye


class NeedsDevice(StaticOnly):
    """A plugin whose own check refuses a setting before anything starts."""

    @classmethod
    def check(cls, cfg, mode: str) -> None:
        if cfg.device != "tpu":
            raise ValueError(f"runs on a tpu only, not {cfg.device}")


def test_a_plugin_backends_own_check_refuses_the_settings_before_anything_starts(monkeypatch):
    point = metadata.EntryPoint("needs_device", f"{__name__}:NeedsDevice", BACKEND_GROUP)
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [point] if kw.get("group") == BACKEND_GROUP else real(**kw))
    with pytest.raises(ConfigError, match=r"backend needs_device \(\S*test_backend_plugins:NeedsDevice\) refused "
                                          r"the settings: ValueError: runs on a tpu only, not auto"):
        check_before_start(RunConfig(backend="needs_device", dataset="synthetic", strategy="naive"))
    check_before_start(RunConfig(backend="needs_device", dataset="synthetic", strategy="naive", device="tpu"))
