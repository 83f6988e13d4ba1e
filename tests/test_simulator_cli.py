"""`batchlab simulate`: one point into OUT, a grid into OUT/strategy=<label>/rate=<r>/repeat=<k>/ that the report
reads."""
import json

from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.report.points import load_collection
from batchlab.collector.layout import point_dir

runner = CliRunner()
FAST = ["--duration", "2", "--dataset", "synthetic", "--preset", "a100-llama2-7b"]
TABLES = {"requests.parquet", "tokens.parquet", "batches.parquet", "summary.json", "schedule.parquet",
          "config.yaml"}


def test_one_point_writes_a_live_runs_files_into_out(tmp_path):
    result = runner.invoke(app, ["simulate", "--strategy", "continuous", "--rate", "5", *FAST, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert TABLES | {"steps.parquet"} <= {p.name for p in tmp_path.iterdir()}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["simulated"] is True and summary["end_reason"] == "simulated"
    assert summary["finished"] == summary["submitted"] > 0


def test_comma_lists_make_a_grid_the_report_reads_as_a_sweep(tmp_path):
    result = runner.invoke(app, ["simulate", "--strategy", "naive,dynamic", "--rate", "4,8", *FAST,
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert TABLES <= {p.name for p in (tmp_path / point_dir("dynamic", 8, 0)).iterdir()}
    index = json.loads((tmp_path / "sweep.json").read_text())
    assert [p["dir"] for p in index["points"]] == [str(point_dir(lb, r, 0)) for r in (4, 8)
                                                   for lb in ("naive", "dynamic")]
    coll = load_collection(tmp_path)
    assert coll.labels() == ["naive", "dynamic"] and coll.rates() == [4.0, 8.0] and not coll.failed


def test_a_sweep_yaml_with_automatic_rates_probes_capacity_in_virtual_time(tmp_path):
    config = tmp_path / "grid.yaml"
    config.write_text("base: {backend: sim, dataset: synthetic, duration_s: 2, max_new_tokens: 32}\n"
                      "grid: {strategies: [dynamic, continuous], rates: {auto: {fractions: [0.5, 1.0]}}}\n")
    result = runner.invoke(app, ["simulate", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert index["probe"]["label"] == "dynamic" and index["probe"]["capacity_req_s"] > 0
    assert len(index["rates"]) == 2 and len(index["points"]) == 4


def test_an_unknown_preset_is_one_line_and_exit_1(tmp_path):
    result = runner.invoke(app, ["simulate", "--preset", "h100-imaginary", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "unknown sim preset 'h100-imaginary'" in result.output


def test_a_stalled_policy_ends_the_simulation_with_exit_2_and_its_line(tmp_path):
    result = runner.invoke(app, ["simulate", "--strategy", "tests.fault_plugins:Never", "--rate", "5", *FAST,
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "stalled: policy launched nothing for 60 s with" in result.output.strip().splitlines()[-1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (reason,) = summary["failure_reasons"]
    assert summary["finished"] == 0 and reason.startswith("stalled")
