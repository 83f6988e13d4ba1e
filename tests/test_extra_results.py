"""`batchlab report --extra` reads GuideLLM's and AIPerf's result files (hand-made fixtures in tests/data/,
from their schemas) as external points in batchlab's units, told apart from vLLM's by their content."""
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.report.external import load_external, points_of
from batchlab.report.points import ReportError

runner = CliRunner()
DATA = Path(__file__).parent / "data"
GUIDELLM = DATA / "guidellm_benchmarks.json"
AIPERF = DATA / "aiperf_profile_export.json"


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_guidellm_gives_one_point_per_benchmark_in_seconds():
    points = points_of(GUIDELLM, _load(GUIDELLM))
    assert [p.label for p in points] == ["guidellm: synchronous [guidellm_benchmarks]",
                                         "guidellm: constant @ 2.5 req/s [guidellm_benchmarks]",
                                         "guidellm: throughput [guidellm_benchmarks]"]
    sync, constant, throughput = points
    assert math.isnan(sync.rate) and constant.rate == 2.5 and math.isinf(throughput.rate)
    assert constant.kind == "guidellm" and (constant.completed, constant.failed) == (74, 1)
    assert constant.requests_per_s == pytest.approx(2.47) and constant.throughput_tok_s == pytest.approx(316.0)
    assert constant.latency["ttft"]["p50"] == pytest.approx(0.031)  # 31 ms
    assert constant.latency["ttft"]["p99"] == pytest.approx(0.088)
    assert constant.latency["e2e"]["mean"] == pytest.approx(0.95)  # GuideLLM writes request_latency in s
    assert constant.latency["tpot"]["p90"] == pytest.approx(0.0084)  # its inter_token_latency_ms


def test_guidellm_leaves_itl_empty_it_has_no_gap_distribution():
    for point in points_of(GUIDELLM, _load(GUIDELLM)):
        assert set(point.latency["itl"].values()) == {None}


def test_guidellm_before_0_7_keeps_its_strategy_under_args():
    data = _load(GUIDELLM)
    for bench in data["benchmarks"]:
        bench["args"] = {"strategy": bench.pop("config")["strategy"]}
        bench["request_totals"] = bench["metrics"].pop("request_totals")
    points = points_of(GUIDELLM, data)
    assert points[1].label.startswith("guidellm: constant @ 2.5 req/s") and points[1].completed == 74


def test_aiperf_gives_one_point_in_seconds_with_its_rate():
    (point,) = points_of(AIPERF, _load(AIPERF))
    assert point.label == "aiperf: @ 4 req/s [aiperf_profile_export]" and point.rate == 4.0
    assert (point.completed, point.failed) == (98, 2)
    assert point.requests_per_s == pytest.approx(3.92) and point.throughput_tok_s == pytest.approx(498.6)
    assert point.latency["ttft"]["p50"] == pytest.approx(0.0426)
    assert point.latency["tpot"]["p99"] == pytest.approx(0.01037)  # its inter_token_latency
    assert point.latency["itl"]["p99"] == pytest.approx(0.0152)  # its inter_chunk_latency
    assert point.latency["e2e"]["mean"] == pytest.approx(1.0124)


def test_aiperf_units_are_converted_from_what_the_file_says():
    data = _load(AIPERF)
    data["time_to_first_token"] = {"unit": "ns", "avg": 5e7, "p50": 4e7, "p99": 9e7}
    data["request_throughput"] = {"unit": "requests/ms", "avg": 0.004}
    (point,) = points_of(AIPERF, data)
    assert point.latency["ttft"]["p50"] == pytest.approx(0.04) and point.latency["ttft"]["p90"] is None
    assert point.requests_per_s == pytest.approx(4.0)


def test_aiperf_at_a_concurrency_has_no_rate_and_lacking_figures_stay_empty():
    data = _load(AIPERF)
    data["input_config"]["loadgen"] = {"concurrency": 8}
    del data["output_token_throughput"], data["inter_chunk_latency"]
    (point,) = points_of(AIPERF, data)
    assert point.label.startswith("aiperf: @ concurrency 8") and math.isnan(point.rate)
    assert math.isnan(point.throughput_tok_s) and point.latency["itl"]["p50"] is None


def test_the_format_is_told_by_content_not_by_name(tmp_path):
    for source, kind in ((GUIDELLM, "guidellm"), (AIPERF, "aiperf")):
        renamed = tmp_path / "results.json"
        renamed.write_text(source.read_text())
        assert {p.kind for p in load_external(tmp_path, [str(renamed)])} == {kind}
    assert points_of(tmp_path / "x.json", {"benchmarks": [], "request_throughput": 3.0}) is None


def test_guidellm_and_aiperf_files_lying_in_the_folder_are_found(tmp_path):
    (tmp_path / "benchmarks.json").write_text(GUIDELLM.read_text())
    (tmp_path / "profile_export_aiperf.json").write_text(AIPERF.read_text())
    (tmp_path / "other.json").write_text(json.dumps({"benchmarks": "none"}))
    kinds = [p.kind for p in load_external(tmp_path)]
    assert sorted(kinds) == ["aiperf", "guidellm", "guidellm", "guidellm"]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"hello": 1}), json.dumps([1, 2]),
                                     json.dumps({"benchmarks": [{"metrics": {"request_latency": 1}}]}),
                                     json.dumps({"benchmarks": [{"metrics": {"request_latency": {"successful": 1}}}]}),
                                     json.dumps({"request_throughput": {"unit": "lumens", "avg": 1.0},
                                                 "time_to_first_token": {"unit": "ms", "avg": 1.0}})])
def test_an_unreadable_or_unknown_file_is_one_line_naming_it_and_the_formats(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(ReportError) as caught:
        load_external(tmp_path, [str(bad)])
    line = str(caught.value)
    assert "\n" not in line and str(bad) in line
    assert "vllm bench serve" in line or "AIPerf metric" in line, line
    if "AIPerf metric" not in line:
        assert "GuideLLM" in line and "AIPerf" in line


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    result = runner.invoke(app, ["simulate", "--duration", "2", "--dataset", "synthetic", "--rate", "6",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_report_shows_guidellm_and_aiperf_points_and_their_definitions(run_folder):
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(GUIDELLM), "--extra", str(AIPERF)])
    assert result.exit_code == 0, result.output
    table = (run_folder / "REPORT.md").read_text().split("## Other tools' runs")[1]
    assert ("| guidellm: constant @ 2.5 req/s [guidellm_benchmarks] | guidellm | 2.5 | 74 | 1 | 0 | 2.47 | 316 |"
            in table)
    assert "| guidellm: synchronous [guidellm_benchmarks] | guidellm | - |" in table
    assert "| aiperf: @ 4 req/s [aiperf_profile_export] | aiperf | 4 | 98 | 2 | - | 3.92 | 499 | 42.6 / 118.4 |" \
        in table
    assert "- guidellm: " in table and "- aiperf: " in table and "- vllm bench serve" not in table
    page = (run_folder / "REPORT.html").read_text()
    assert "guidellm: throughput [guidellm_benchmarks]" in page and "aiperf: @ 4 req/s" in page
    assert 'id="external-definitions"' in page


def test_report_refuses_an_unknown_extra_file_in_one_line(run_folder, tmp_path):
    bad = tmp_path / "profile_export_aiperf.csv"
    bad.write_text("Metric,avg\nRequest Latency (ms),1.0\n")
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(bad)])
    assert result.exit_code == 1 and str(bad) in result.output
    assert "guidellm run --output kind=json,path=FILE" in result.output
    assert "Traceback" not in result.output
