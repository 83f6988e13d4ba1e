"""Count-based stops and an infinite rate: --num-requests beside --duration, --rate inf."""
import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from batchlab.runner.preflight import checked_config
from batchlab.cli.main import app
from batchlab.protocol.settings import ConfigError
from batchlab.traffic.arrivals import arrival_offsets
from batchlab.traffic.run_schedule import make_schedule, traffic_config
from batchlab.traffic.schedule import build_schedule

runner = CliRunner()
SYNTHETIC = {"dataset": "synthetic", "prompt_lengths": 16, "output_lengths": 8}


def test_a_count_stop_keeps_the_first_arrivals_of_the_duration_stop():
    full = arrival_offsets("poisson", 20.0, 10.0, np.random.default_rng([3, 0]))
    first = arrival_offsets("poisson", 20.0, 10.0, np.random.default_rng([3, 0]), count=25)
    np.testing.assert_array_equal(first, full[:25])


def test_the_duration_stops_first_when_it_comes_first():
    full = arrival_offsets("constant", 4.0, 2.0, np.random.default_rng(0))
    capped = arrival_offsets("constant", 4.0, 2.0, np.random.default_rng(0), count=1000)
    assert len(full) == 8
    np.testing.assert_array_equal(capped, full)


def test_rate_inf_sends_every_request_at_time_zero():
    offsets = arrival_offsets("poisson", math.inf, 10.0, np.random.default_rng(0), count=7)
    np.testing.assert_array_equal(offsets, np.zeros(7))


def test_rate_inf_without_a_count_is_refused():
    with pytest.raises(ConfigError, match="num_requests=N"):
        checked_config({"rate": math.inf}, {})
    with pytest.raises(ValueError, match="count"):
        arrival_offsets("poisson", math.inf, 10.0, np.random.default_rng(0))


def test_a_count_without_a_duration_is_a_count_only_stop():
    cfg = checked_config({**SYNTHETIC, "rate": 5.0}, {"num_requests": 200})
    assert cfg.duration_s > 200 / 5.0  # long enough for all 200 at 5 req/s
    assert make_schedule(cfg).n_requests == 200


def test_a_given_duration_stays_a_stop_beside_the_count():
    cfg = checked_config({**SYNTHETIC, "rate": 5.0, "duration_s": 2.0}, {"num_requests": 200})
    assert cfg.duration_s == 2.0
    assert make_schedule(cfg).n_requests < 200


def test_a_trace_replay_stops_after_the_count():
    cfg = checked_config({"dataset": "azure-code", "arrival": "trace", "duration_s": 60.0}, {"num_requests": 5})
    schedule = build_schedule(traffic_config(cfg), None)
    assert schedule.n_requests == 5
    assert schedule.notes["trace_requests"] == 5


def test_negative_count_is_one_line_and_exit_1(tmp_path):
    result = runner.invoke(app, ["simulate", "--num-requests", "-3", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "--num-requests" in result.output and "Traceback" not in result.output


def test_simulate_with_rate_inf_and_a_count_plays_exactly_that_many(tmp_path):
    result = runner.invoke(app, ["simulate", "--strategy", "dynamic", "--rate", "inf", "--num-requests", "12",
                                 "--dataset", "synthetic", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["submitted"] == 12 and summary["settings"]["num_requests"] == 12
    assert summary["settings"]["rate"] == "inf"  # JSON has no infinity: written as vLLM writes it
    schedule = pd.read_parquet(tmp_path / "schedule.parquet")
    assert (schedule["arrival_offset_s"] == 0).all()
    report = runner.invoke(app, ["report", str(tmp_path)])
    assert report.exit_code == 0, report.output
    assert "### λ = inf req/s" in (tmp_path / "REPORT.md").read_text()


def test_a_yaml_rate_inf_reads_as_infinity():
    assert checked_config({"rate": "inf", "num_requests": 3}, {}).rate == math.inf


def test_a_sweep_base_count_reaches_every_point(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text("base: {dataset: synthetic, num_requests: 9}\n"
                      "grid: {strategies: [naive, dynamic], rates: [3, 30]}\n")
    result = runner.invoke(app, ["simulate", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summaries = list((tmp_path / "out").glob("sweep_label=*/sweep_rate=*/sweep_repeat=0/summary.json"))
    assert len(summaries) == 4
    assert all(json.loads(p.read_text())["submitted"] == 9 for p in summaries)


@pytest.mark.slow  # real processes through the CLI
def test_a_live_run_at_rate_inf_ends_after_its_count(tmp_path):
    result = runner.invoke(app, ["run", "--backend", "sim", "--rate", "inf", "--num-requests", "10",
                                 "--dataset", "synthetic", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["submitted"] == summary["finished"] == 10
