"""Report pieces on hand-made tables: honest signs, SLO parsing, intervals, tool formulas, queue length."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from batchlab.report.build import parse_slos
from batchlab.report.points import ReportError, load_collection
from batchlab.report.stats import TOOL_FORMULAS, GroupStats, tool_formulas, weighted_percentiles
from batchlab.report.tokens import frame_digest
from tests.summaries import make_summary
from batchlab.report.plots import queue_length


def group(label: str, rate: float, throughput: float, ttft: float, e2e: float = 1.0,
          failed: int = 0, scheduled: int = 100) -> GroupStats:
    lat = {m: {"mean": v, "p50": v, "p90": v, "p99": v} for m, v in (("ttft", ttft), ("e2e", e2e),
                                                                      ("tpot", 0.01), ("itl", 0.01))}
    return GroupStats(label, rate, 1, throughput, 1.0, scheduled, failed, lat, {}, 0, 1.0, None)


def test_slos_parse_with_units_into_seconds():
    assert parse_slos(["ttft=500ms", "tpot=0.05s", "e2e=2000"]) == {"ttft": 0.5, "tpot": 0.05, "e2e": 2.0}
    for bad in ("ttft", "speed=3ms", "ttft=fast"):
        with pytest.raises(ReportError):
            parse_slos([bad])


def test_tool_formulas_differ_where_the_tools_differ():
    # request 0: 3 tokens at 0, 1, 2 s; request 1: 5 tokens at 0, .1, .2, .3, 2.3 s (one long stall)
    tokens = pd.DataFrame({"request_id": [0, 0, 0, 1, 1, 1, 1, 1], "token_index": [0, 1, 2, 0, 1, 2, 3, 4],
                           "time": [0, 1, 2, 0, .1, .2, .3, 2.3]})
    finished = pd.DataFrame({"request_id": [0, 1], "output_len": [3, 5], "ttft": [0.5, 0.5], "e2e": [2.5, 2.8]})
    f = tool_formulas([finished], [frame_digest(tokens)])
    assert f[TOOL_FORMULAS["vllm_tpot"]]["mean"] == pytest.approx((1.0 + 0.575) / 2)
    assert f[TOOL_FORMULAS["vllm_itl"]]["mean"] == pytest.approx(4.3 / 6)  # pooled: 6 gaps
    assert f[TOOL_FORMULAS["vllm_itl"]]["p50"] == pytest.approx(0.55)  # gaps .1 .1 .1 1 1 2
    assert f[TOOL_FORMULAS["aiperf_itl"]]["p50"] == pytest.approx((1.0 + 0.575) / 2)
    # GuideLLM weights each request's figure by its out − 1 tokens: request 0 (1.0) twice, request 1 (0.575) 4 times
    assert f[TOOL_FORMULAS["guidellm_itl"]]["mean"] == pytest.approx((2 * 1.0 + 4 * 0.575) / 6)
    assert f[TOOL_FORMULAS["guidellm_itl"]]["p50"] == pytest.approx(0.575)  # weighted CDF 4/6 ≥ 0.5 at 0.575
    assert f[TOOL_FORMULAS["guidellm_itl"]]["p90"] == pytest.approx(1.0)


def test_weighted_percentiles_are_guidellms_inverted_weighted_cdf():
    values, weights = np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0])  # CDF over 1, 2, 3: .25, .75, 1
    out = weighted_percentiles(values, weights)
    assert out["mean"] == pytest.approx((3 + 1 + 4) / 4)
    assert (out["p50"], out["p90"], out["p99"]) == (2.0, 3.0, 3.0)
    assert weighted_percentiles(np.array([]), np.array([]))["p50"] is None


def test_queue_length_counts_arrivals_minus_launches():
    requests = pd.DataFrame({"arrival_time": [0.0, 1.0, 2.0], "scheduled_time": [1.5, 1.5, 3.0],
                             "submitted": [True, True, True]})
    times, queue = queue_length(requests)
    assert list(times) == [0.0, 1.0, 1.5, 1.5, 2.0, 3.0]
    assert list(queue) == [1, 2, 1, 0, 1, 0]


def test_a_folder_without_runs_is_a_report_error(tmp_path):
    with pytest.raises(ReportError, match="holds no run"):
        load_collection(tmp_path)


def test_the_setup_says_what_an_engines_prefix_cache_did():
    import pandas as pd

    from batchlab.report.points import RunData
    from batchlab.report.setup import prefix_cache_line

    def run(facts: dict, summary: dict) -> RunData:
        empty = pd.DataFrame()
        summary = make_summary(settings={"workers": {"worker-0": facts}}, **summary)
        return RunData("vllm", 4.0, 0, Path("."), summary, empty, empty, empty, empty)

    warm = run({"prefix_caching": True, "prefix_cache_reset_between_runs": True},
               {"prefix_cache": {"hit_rate": 0.25}})
    assert prefix_cache_line(warm) == ("- prefix cache (vllm): on, emptied before every run; hit rate 25.0% of "
                                       "prompt tokens at λ = 4 req/s")
    server = run({"prefix_cache_reset": "not reset: the server answered HTTP 404"},
                 {"worker_stats": {"worker-0": {"server_prefix_cache": {"hit_rate": 0.5}}}})
    assert "server's, not reset: the server answered HTTP 404; hit rate 50.0%" in prefix_cache_line(server)
    assert prefix_cache_line(run({"dtype": "float32"}, {})) == ""  # an engine without one: no line


@pytest.mark.slow
def test_a_trace_replayed_at_its_own_timing_is_reported_at_the_traces_rate(tmp_path):
    from batchlab.report.build import run_report
    from batchlab.report.points import own_trace_rate
    from tests.conftest import run_cli

    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_len,output_len\n" + "".join(f"{i * 0.25},{16 + i},{4 + i % 5}\n"
                                                                   for i in range(40)))
    out = tmp_path / "sweep"
    run_cli("simulate", "--strategy", "naive,dynamic", "--dataset", f"trace:{trace}", "--arrival", "trace",
            "--duration", "5", "--out", str(out), timeout_s=120)
    result = run_report(str(out))
    text = result.path.read_text()
    assert "no planned rate" not in text and "### λ = 4 req/s" in text  # 20 requests in [0, 5) s
    assert own_trace_rate(make_summary(settings={"arrival": "trace", "duration_s": 5}, scheduled=20)) == 4.0
    assert own_trace_rate(make_summary(settings={"arrival": "poisson", "duration_s": 5}, scheduled=20)) == 0.0


@pytest.mark.parametrize("text, says", [('{"settings": {}}', "(scheduled: field required)"),
                                        ("{not json", "(the file: invalid json")])
def test_a_malformed_summary_is_one_line_and_exit_1_not_a_traceback(tmp_path, text, says):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    (tmp_path / "summary.json").write_text(text)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'summary.json'}: not a batchlab run summary")
    assert says in lines[0]
