"""Closed-loop load end to end: real processes through the CLI, on the sim backend."""
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app

runner = CliRunner()
SHORT = ["--dataset", "synthetic", "--prompt-lengths", "16-48", "--output-lengths", "4-12",
         "--preset", "cpu-tiny-mistral"]


def _most_in_flight(requests: pd.DataFrame) -> int:
    """The most requests between their arrival and their end at any instant (an end before an arrival at
    the same time: equality at the boundary is no overlap)."""
    ends = requests["completion_time"].fillna(requests["arrival_time"])
    events = sorted([(t, 1) for t in requests["arrival_time"]] + [(t, -1) for t in ends])
    level, most = 0, 0
    for _, step in events:
        level += step
        most = max(most, level)
    return most


@pytest.mark.slow  # real processes through the CLI
def test_four_clients_never_have_more_than_four_requests_out(tmp_path):
    result = runner.invoke(app, ["run", "--backend", "sim", "--strategy", "continuous", "--concurrency", "4",
                                 "--num-requests", "40", *SHORT, "--out", str(tmp_path),
                                 "--save-result", str(tmp_path / "vllm.json")])
    assert result.exit_code == 0, result.output
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(requests) == 40 and requests["request_id"].is_unique
    assert requests["status"].isin(["finished", "failed"]).all()
    assert _most_in_flight(requests) == 4
    schedule = pd.read_parquet(tmp_path / "schedule.parquet")  # the send times, as sent
    offsets = schedule.set_index("request_id")["arrival_offset_s"]
    arrivals = requests.set_index("request_id")["arrival_time"]
    assert ((arrivals - arrivals.min()) - offsets).abs().max() < 1e-6
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["concurrency"] == 4 and summary["finished"] == 40
    assert "(4 closed-loop clients)" in result.output
    assert json.loads((tmp_path / "vllm.json").read_text())["max_concurrency"] == 4
    report = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report" / "REPORT.md").read_text()
    assert "coordinated omission" in text and "### 4 clients" in text
    assert (tmp_path / "report" / "latency_vs_concurrency.png").is_file()


def test_concurrency_beside_a_rate_is_one_line_and_exit_1(tmp_path):
    result = runner.invoke(app, ["run", "--concurrency", "4", "--rate", "5", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "--concurrency" in result.output
    assert not (tmp_path / "run").exists()
