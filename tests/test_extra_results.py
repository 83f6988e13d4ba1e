"""`batchlab report --extra` reads GuideLLM's and AIPerf's result files (hand-made fixtures in tests/data/,
from their schemas) as external points in batchlab's units, told apart from vLLM's by their content."""
import json
import math
import shutil
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


def _labelled(path: Path) -> list:
    """The points of one file as the report labels them."""
    return load_external(path.parent / "no-such-folder", [str(path)])


def test_guidellm_gives_one_point_per_benchmark_in_seconds():
    points = points_of(GUIDELLM, _load(GUIDELLM))
    assert sorted(p.label for p in _labelled(GUIDELLM)) == ["guidellm: constant @ 2.5 req/s [guidellm_benchmarks]",
                                                            "guidellm: synchronous [guidellm_benchmarks]",
                                                            "guidellm: throughput [guidellm_benchmarks]"]
    sync, constant, throughput = points
    assert math.isnan(sync.rate) and constant.rate == 2.5 and math.isinf(throughput.rate)
    assert constant.kind == "guidellm" and (constant.completed, constant.failed) == (74, 1)
    assert constant.requests_per_s == pytest.approx(2.47) and constant.throughput_tok_s == pytest.approx(316.0)
    assert constant.latency["ttft"]["p50"] == pytest.approx(0.031)  # 31 ms
    assert constant.latency["ttft"]["p99"] == pytest.approx(0.088)
    assert constant.latency["e2e"]["mean"] == pytest.approx(0.95)  # GuideLLM writes request_latency in s
    assert constant.latency["tpot"]["p90"] == pytest.approx(0.0084)  # its inter_token_latency_ms
    assert constant.names == {"tpot": "ITL"}  # shown in the TPOT column under its own name


def test_guidellm_leaves_itl_empty_it_has_no_gap_distribution():
    for point in points_of(GUIDELLM, _load(GUIDELLM)):
        assert set(point.latency["itl"].values()) == {None}


def test_guidellm_before_0_7_keeps_its_strategy_under_args():
    data = _load(GUIDELLM)
    for bench in data["benchmarks"]:
        bench["args"] = {"strategy": bench.pop("config")["strategy"]}
        bench["request_totals"] = bench["metrics"].pop("request_totals")
    points = points_of(GUIDELLM, data)
    assert points[1].head == "guidellm: constant @ 2.5 req/s" and points[1].completed == 74


def test_aiperf_gives_one_point_in_seconds_with_its_rate():
    (point,) = _labelled(AIPERF)
    assert point.label == "aiperf: @ 4 req/s [aiperf_profile_export]" and point.rate == 4.0
    assert (point.completed, point.failed) == (98, 2)
    assert point.requests_per_s == pytest.approx(3.92) and point.throughput_tok_s == pytest.approx(498.6)
    assert point.latency["ttft"]["p50"] == pytest.approx(0.0426)
    assert point.latency["tpot"]["p99"] == pytest.approx(0.01037)  # its inter_token_latency
    assert point.latency["itl"]["p99"] == pytest.approx(0.0152)  # its inter_chunk_latency
    assert point.names == {"tpot": "ITL", "itl": "inter-chunk latency"}
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
    assert point.head == "aiperf: @ concurrency 8" and math.isnan(point.rate)
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
def test_an_unreadable_or_unknown_file_is_one_line_naming_it_and_what_it_is(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(ReportError) as caught:
        load_external(tmp_path, [str(bad)])
    line, = caught.value.lines
    assert "\n" not in line and str(bad) in line
    said = ("not JSON", "not a result file", "a corrupt GuideLLM report", "a corrupt AIPerf export")
    assert any(s in line for s in said), line
    if "corrupt" not in line:  # a file of no tool's format: the formats batchlab reads
        assert "GuideLLM" in line and "AIPerf" in line and "vllm bench serve" in line


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
    assert ("| guidellm: constant @ 2.5 req/s [guidellm_benchmarks] | guidellm | constant, 2.5 req/s | 2.5 | 74 | 1 "
            "| 0 | 2.47 | 316 |") in table
    assert "| guidellm: synchronous [guidellm_benchmarks] | guidellm | synchronous | - |" in table
    assert ("| aiperf: @ 4 req/s [aiperf_profile_export] | aiperf | 4 req/s, no concurrency limit | 4 | 98 | 2 | - "
            "| 3.92 | 499 | 42.6 / 118.4 |") in table
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


def _report(folder: Path, *extra: Path):
    return runner.invoke(app, ["report", str(folder), *(a for f in extra for a in ("--extra", str(f)))])


def _one_line_each(result, *files: Path) -> None:
    """Exit 1, one `error:` line per refused file, each naming its file, no traceback."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(lines) == len(files) and all(ln.startswith("error: ") for ln in lines), lines
    for f in files:
        assert sum(str(f) in ln for ln in lines) == 1, (f, lines)


@pytest.fixture
def own_run(run_folder, tmp_path) -> Path:
    """A copy of the module's run folder, for files dropped into it."""
    return Path(shutil.copytree(run_folder, tmp_path / "run", ignore=shutil.ignore_patterns("REPORT.*", "*.png")))


HOSTILE = {"deep.json": "[" * 200_000 + "]" * 200_000,
           "huge.json": json.dumps({**json.loads((DATA / "real" / "vllm-0.32.0_sweep_summary.json").read_text())[0],
                                    "completed": 1}).replace('"completed": 1', '"completed": 1e999')}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_json_is_one_line_and_exit_1_given_or_lying_in_the_folder(own_run, tmp_path, name):
    bad = tmp_path / name
    bad.write_text(HOSTILE[name])
    result = _report(own_run, bad)
    _one_line_each(result, bad)
    assert ("nested deeper" if name == "deep.json" else "completed is inf, not a count") in result.output
    shutil.copy(bad, own_run / name)
    result = _report(own_run)
    _one_line_each(result, own_run / name)
    assert "in the report's folder" in result.output and not (own_run / "REPORT.md").exists()


def test_a_truncated_report_in_the_folder_is_named_not_skipped(own_run):
    text = (DATA / "real" / "guidellm-0.8.1_synchronous_benchmarks.json").read_text()
    (own_run / "benchmarks.json").write_text(text[: len(text) // 2])
    result = _report(own_run)
    _one_line_each(result, own_run / "benchmarks.json")
    assert "cut short" in result.output


def test_every_bad_file_is_named(own_run, tmp_path):
    (tmp_path / "sweep").mkdir()
    files = [tmp_path / "a.json", tmp_path / "b.json", tmp_path / "summary.json", tmp_path / "sweep"]
    files[0].write_text("{not json")
    files[1].write_text(json.dumps({"hello": 1}))
    files[2].write_text((own_run / "summary.json").read_text())
    result = _report(own_run, *files)
    _one_line_each(result, *files)
    assert "a batchlab run's summary.json" in result.output and "not a result file" in result.output


def test_vllms_jsonl_and_sweep_summary_lying_in_the_folder_are_read(own_run):
    for name in ("vllm-0.32.0_append-result.json", "vllm-0.32.0_sweep_summary.json"):
        shutil.copy(DATA / "real" / name, own_run / name)
    result = _report(own_run)
    assert result.exit_code == 0, result.output
    table = (own_run / "REPORT.md").read_text().split("## Other tools' runs")[1]
    assert "| openai tiny-mistral [vllm-0.32.0_append-result, line 2] | vllm bench serve |" in table
    assert "| openai tiny-mistral [vllm-0.32.0_sweep_summary] | vllm bench serve |" in table


def test_a_latency_of_inf_is_named_with_its_file_and_field_never_a_silent_dash(own_run, tmp_path):
    vllm = json.loads((DATA / "real" / "vllm-0.32.0_sweep_summary.json").read_text())[0]
    (tmp_path / "vllm_inf.json").write_text(json.dumps(vllm).replace(
        f'"mean_ttft_ms": {json.dumps(vllm["mean_ttft_ms"])}', '"mean_ttft_ms": 1e999'))
    guidellm = json.loads(GUIDELLM.read_text())
    guidellm["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]["median"] = float("inf")
    (tmp_path / "guidellm_inf.json").write_text(json.dumps(guidellm))
    result = _report(own_run, tmp_path / "vllm_inf.json", tmp_path / "guidellm_inf.json")
    assert result.exit_code == 0, result.output
    text = (own_run / "REPORT.md").read_text()
    assert "- vllm_inf.json: mean_ttft_ms = inf (shown as '-')" in text
    assert ("- guidellm_inf.json: benchmarks[0].metrics.time_to_first_token_ms.successful.median = inf "
            "(shown as '-')") in text
    assert 'id="external-not-finite"' in (own_run / "REPORT.html").read_text()


def test_an_endless_rate_means_all_at_once_and_is_no_warning():
    from batchlab.report.peer_point import not_finite

    assert not_finite({"request_rate": float("inf"), "burstiness": float("inf")}) == []
    assert not_finite({"request_rate": float("nan"), "p99_e2el_ms": float("-inf")}) == [
        "request_rate = nan", "p99_e2el_ms = -inf"]
