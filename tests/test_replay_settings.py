"""A replayed --schedule records its own traffic settings; an option contradicting them is refused."""
import json
import os
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from batchlab.runner.config import replay_config
from batchlab.protocol.settings import ConfigError, build_config
from batchlab.cli.main import app
from tests.conftest import ROOT
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.schedule import Schedule, build_schedule, save_schedule, saved_settings

TRAFFIC = TrafficConfig(arrival="gamma", rate=7.0, duration_s=1.0, burstiness=0.5, seed=5, dataset="synthetic",
                        max_new_tokens=32, max_prompt_len=64)
runner = CliRunner()


@pytest.fixture
def schedule_file(tmp_path):
    """A schedule built from TRAFFIC, saved with its settings."""
    path = tmp_path / "schedule.parquet"
    save_schedule(build_schedule(TRAFFIC, None), path)
    return path


@pytest.fixture
def bare_schedule_file(tmp_path):
    """The same requests saved without the settings that made them (as an older file would be)."""
    schedule = build_schedule(TRAFFIC, None)
    path = tmp_path / "bare.parquet"
    save_schedule(Schedule(schedule.frame, schedule.content_hash, schedule.duration_s, None), path)
    return path, schedule.n_requests


def replayed(path, file_values: dict | None = None, given: dict | None = None) -> dict:
    """The settings a run replaying `path` records."""
    cfg = build_config({**(file_values or {}), "schedule": str(path)}, given or {})
    return replay_config(cfg, given or {}).as_settings()


def test_replayed_schedule_records_its_own_settings_not_the_defaults_or_the_yaml(schedule_file):
    settings = replayed(schedule_file, file_values={"rate": 3.0, "seed": 1, "arrival": "poisson"})
    assert {k: settings[k] for k in TRAFFIC.to_dict() if k in settings} == {
        "arrival": "gamma", "rate": 7.0, "duration_s": 1.0, "burstiness": 0.5, "seed": 5, "dataset": "synthetic",
        "max_new_tokens": 32, "max_prompt_len": 64, "trace_start_s": 0.0, "prompt_lengths": "32-512",
        "output_lengths": "16-256", "num_requests": 0}


def test_an_option_equal_to_the_schedules_value_is_accepted(schedule_file):
    assert replayed(schedule_file, given={"rate": 7.0, "seed": 5})["rate"] == 7.0


def test_an_option_contradicting_the_replayed_schedule_is_one_line(schedule_file, tmp_path):
    result = runner.invoke(app, ["run", "--backend", "sim", "--schedule", str(schedule_file), "--rate", "5",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.stderr == ("error: --rate 5 conflicts with the replayed schedule (rate 7); "
                             "drop it or build a new schedule\n")


@pytest.mark.parametrize("given, message", [({"seed": 6}, r"seed=6 .*\(seed 5\)"),
                                            ({"duration_s": 2.0}, r"duration_s=2.0 .*\(duration_s 1\)"),
                                            ({"dataset": "sharegpt"}, r"dataset='sharegpt' .*\(dataset synthetic\)"),
                                            ({"max_new_tokens": 64}, r"max_new_tokens=64 .*\(max_new_tokens 32\)")])
def test_every_traffic_option_is_checked_against_the_schedule(schedule_file, given, message):
    with pytest.raises(ConfigError, match=message):
        replayed(schedule_file, given=given)


def test_a_schedule_saved_without_settings_records_duration_mean_rate_and_unknowns(bare_schedule_file):
    path, n = bare_schedule_file
    assert saved_settings(path) == ({"duration_s": 1.0, "rate": n / 1.0}, False)
    settings = replayed(path, file_values={"seed": 9, "max_prompt_len": 99}, given={"arrival": "gamma"})
    assert (settings["duration_s"], settings["rate"], settings["arrival"]) == (1.0, n / 1.0, "gamma")
    assert all(settings[k] is None for k in ("burstiness", "seed", "dataset", "max_prompt_len"))
    assert settings["max_new_tokens"] == 128  # the cap the scheduler's policy runs with


def test_a_missing_schedule_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        replayed(tmp_path / "nothing.parquet")


@pytest.mark.slow
def test_a_replayed_run_writes_the_schedules_settings(schedule_file, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "batchlab.cli.main", "run", "--backend", "sim", "--schedule",
                           str(schedule_file), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads((out / "summary.json").read_text())["settings"]
    written = yaml.safe_load((out / "config.yaml").read_text())
    for settings in (recorded, written):
        assert (settings["rate"], settings["seed"], settings["arrival"], settings["max_new_tokens"]) == (
            7.0, 5, "gamma", 32)
