"""Report pieces on hand-made tables: honest signs, SLO parsing, intervals, tool formulas, queue length."""
from pathlib import Path

import pandas as pd
import pytest

from batchlab.collector.report.build import parse_slos
from batchlab.collector.report.headline import RULE, Comparison, compare, headlines, sentence
from batchlab.collector.report.points import ReportError, load_collection
from batchlab.collector.report.stats import GroupStats, tool_formulas
from batchlab.collector.report.timeline import queue_length


def group(label: str, rate: float, throughput: float, ttft: float, e2e: float = 1.0,
          failed: int = 0, scheduled: int = 100) -> GroupStats:
    lat = {m: {"mean": v, "p50": v, "p90": v, "p99": v} for m, v in (("ttft", ttft), ("e2e", e2e),
                                                                      ("tpot", 0.01), ("itl", 0.01))}
    return GroupStats(label, rate, 1, throughput, 1.0, scheduled, failed, lat, {}, 0, 1.0, None)


def test_better_dynamic_reads_improved_and_reduced():
    line = sentence(Comparison("dynamic", 20, 12.34, -45.0, -10.0), "NVIDIA H200")
    assert line.startswith("Dynamic batching improved throughput by +12.3% and reduced latency by −45.0% "
                           "compared to naive batching at λ = 20 req/s on NVIDIA H200.")


def test_worse_dynamic_reads_changed_and_increased():
    line = sentence(Comparison("dynamic", 5, -3.0, 20.0, 4.0), "cpu")
    assert "changed throughput by −3.0%" in line and "increased latency by +20.0%" in line
    assert "E2E p50 changed by +4.0%" in line


def test_headline_rate_is_the_highest_where_both_finished_99_percent_not_where_latency_differs_most():
    # TTFT differs most at 5; naive dropped 5% at 40 and dynamic 2% at 50 (no naive there anyway)
    stats = {("naive", 5.0): group("naive", 5, 100, 4.0), ("dynamic", 5.0): group("dynamic", 5, 110, 0.5),
             ("naive", 20.0): group("naive", 20, 200, 4.0, failed=1), ("dynamic", 20.0): group("dynamic", 20, 300, 3.0),
             ("naive", 40.0): group("naive", 40, 250, 8.0, failed=5), ("dynamic", 40.0): group("dynamic", 40, 260, 7.0),
             ("dynamic", 50.0): group("dynamic", 50, 400, 2.0, failed=2)}
    c = compare(stats, "dynamic")
    assert c.rate == 20 and c.throughput_pct == pytest.approx(50.0) and c.ttft_p50_pct == pytest.approx(-25.0)
    line = headlines(stats, ["naive", "dynamic"], {})[0]
    assert "at λ = 20 req/s" in line
    assert ("At the highest rate, λ = 40 req/s: throughput +4.0%, TTFT p50 −12.5%; "
            "failed: dynamic 0 / 100 (0%), naive 5 / 100 (5%).") in line


def test_a_share_just_under_99_percent_does_not_qualify():
    stats = {("naive", 5.0): group("naive", 5, 100, 1.0, failed=1, scheduled=99),
             ("dynamic", 5.0): group("dynamic", 5, 110, 0.5, failed=2, scheduled=199)}
    assert stats[("naive", 5.0)].finished_share == pytest.approx(98 / 99) and compare(stats, "dynamic") is None
    stats[("naive", 5.0)] = group("naive", 5, 100, 1.0, failed=1, scheduled=100)
    assert compare(stats, "dynamic") is None  # dynamic: 197 / 199 = 98.99%
    stats[("dynamic", 5.0)] = group("dynamic", 5, 110, 0.5, failed=2, scheduled=200)
    assert compare(stats, "dynamic").rate == 5


def test_no_qualifying_rate_is_one_sentence_naming_the_rule_and_no_headline():
    stats = {("naive", 5.0): group("naive", 5, 100, 1.0, failed=30),
             ("dynamic", 5.0): group("dynamic", 5, 300, 0.2)}
    assert compare(stats, "dynamic") is None
    lines = headlines(stats, ["naive", "dynamic"], {})
    assert lines == [f"Dynamic batching is not compared to naive batching: no rate qualifies under the fixed "
                     f"rule ({RULE})."]
    assert "≥ 99%" in RULE and "improved" not in lines[0]


def test_no_comparison_without_a_completed_baseline():
    assert compare({("dynamic", 5.0): group("dynamic", 5, 110, 0.5)}, "dynamic") is None


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
    f = tool_formulas(finished, tokens)
    assert f["vLLM TPOT: (e2e−ttft)/(out−1) per request"]["mean"] == pytest.approx((1.0 + 0.575) / 2)
    assert f["vLLM ITL: every gap pooled"]["mean"] == pytest.approx(4.3 / 6)  # pooled: 6 gaps
    assert f["vLLM ITL: every gap pooled"]["p50"] == pytest.approx(0.55)  # gaps .1 .1 .1 1 1 2
    assert f["GuideLLM ITL: mean gap per request"]["mean"] == pytest.approx((1.0 + 0.575) / 2)
    assert f["AIPerf ITL: (last−first)/(out−1) per request"]["p50"] == pytest.approx((1.0 + 0.575) / 2)


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

    from batchlab.collector.report.points import RunData
    from batchlab.collector.report.setup import prefix_cache_line

    def run(facts: dict, summary: dict) -> RunData:
        empty = pd.DataFrame()
        return RunData("vllm", 4.0, 0, Path("."), {"settings": {"workers": {"worker-0": facts}}, **summary},
                       empty, empty, empty, empty)

    warm = run({"prefix_caching": True, "prefix_cache_reset_between_runs": True},
               {"prefix_cache": {"hit_rate": 0.25}})
    assert prefix_cache_line(warm) == ("- prefix cache (vllm): on, emptied before every run; hit rate 25.0% of "
                                       "prompt tokens at λ = 4 req/s")
    server = run({"prefix_cache_reset": "not reset: the server answered HTTP 404"},
                 {"worker_stats": {"worker-0": {"server_prefix_cache": {"hit_rate": 0.5}}}})
    assert "server's, not reset: the server answered HTTP 404; hit rate 50.0%" in prefix_cache_line(server)
    assert prefix_cache_line(run({"dtype": "float32"}, {})) == ""  # an engine without one: no line


def test_a_trace_replayed_at_its_own_timing_is_reported_at_the_traces_rate(tmp_path):
    from batchlab.collector.report.build import run_report
    from batchlab.collector.report.points import own_trace_rate
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
    assert own_trace_rate({"settings": {"arrival": "trace", "duration_s": 5}, "scheduled": 20}) == 4.0
    assert own_trace_rate({"settings": {"arrival": "poisson", "duration_s": 5}, "scheduled": 20}) == 0.0
