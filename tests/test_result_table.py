"""The end-of-run table and its warnings, from a summary."""
from rich.console import Console

from batchlab.cli.live import Progress
from batchlab.cli.result_table import offered_rate, show, warnings
from batchlab.collector.summary import Summary
from batchlab.protocol.settings import RunConfig
from tests.summaries import make_summary


def _summary(**over) -> Summary:
    base = {"scheduled": 100, "finished": 100, "failed": 0, "requests_per_s": 9.8, "throughput_tok_s": 500.0,
            "window_s": 10.2, "settings": {"duration_s": 10.0, "rate": 10.0, "backend": "hf"},
            "ttft": {"p50": 0.05, "p90": 0.08, "p99": 0.1}, "harness_lag": {"p99": 2e-4, "last_arrival_s": 9.9},
            "harness_cpu": {"cpu_s": {"collector": 1.0, "scheduler": 0.5, "worker-0": 9.0}}}
    return make_summary(**base | over)


def test_a_run_that_kept_up_has_no_warning():
    assert warnings(_summary()) == []


def test_a_run_served_well_under_its_offered_rate_is_flagged_overloaded():
    lines = warnings(_summary(requests_per_s=3.0, finished=60, failed=40))
    assert len(lines) == 1 and lines[0].startswith("overloaded: served 3.00 of the 10.00 req/s offered")


def test_queue_full_rejections_are_flagged_even_at_full_rate():
    assert warnings(_summary(failure_reasons={"queue full": 3}))[0].startswith("overloaded: requests were rejected")


def test_a_lagging_sender_and_a_busy_harness_are_flagged():
    summary = _summary(harness_lag={"p99": 0.004}, harness_cpu={"cpu_s": {"collector": 6.0, "scheduler": 3.0}})
    lines = warnings(summary)
    assert any("sender lagged: p99 4.0 ms" in ln for ln in lines)
    assert any("harness used 88% of a core" in ln for ln in lines)


def test_a_model_worker_cpu_is_not_counted_as_harness():
    assert not any("harness used" in ln for ln in warnings(_summary()))  # 9 s of the hf worker's own CPU


def test_offered_rate_over_the_last_arrival_when_a_count_stopped_the_run():
    summary = _summary(scheduled=50, settings={"duration_s": 60.0, "rate": 10.0, "num_requests": 50},
                       harness_lag={"last_arrival_s": 4.9})
    assert abs(offered_rate(summary) - 10.0) < 1e-9  # 50 arrivals over 49 gaps of 0.1 s
    assert offered_rate(_summary(settings={"duration_s": 1.0, "rate": "inf"})) is None


def test_the_table_shows_every_figure_and_the_failures_by_reason():
    console = Console(record=True, width=120)
    show(_summary(failed=2, finished=98, failure_reasons={"queue full": 2}, goodput={"fraction": 0.9, "met": 90,
                                                                                      "submitted": 100, "slos": {}}),
         "runs/x", console)
    text = console.export_text()
    for figure in ("98 / 100", "failed: queue full", "offered rate (req/s)", "10.00", "served rate", "9.80",
                   "goodput (SLOs met)", "90.0% (90 of 100)", "TTFT p50 / p90 / p99 (ms)", "50.0 / 80.0 / 100.0",
                   "results in runs/x: 98 finished, 2 failed"):
        assert figure in text, figure


def test_progress_names_the_phase_from_the_collectors_counts(tmp_path):
    progress = Progress(RunConfig(out=str(tmp_path), duration_s=5.0, strategy="dynamic", backend="sim"))
    assert " starting " in progress.text(0.5, {"traffic": True})
    (tmp_path / "progress.json").write_text('{"arrived": 3, "queued": 1, "in_flight": 2, "finished": 0, "failed": 0}')
    progress.read_at = float("-inf")
    assert " sending " in progress.text(1.0, {}) and "in flight 2 · queued 1" in progress.text(1.0, {})
    progress.read_at = float("-inf")
    assert " draining " in progress.text(7.0, {"traffic": False}) and "(ended: traffic)" in progress.text(7.0, {"traffic": False})


def test_a_count_stopped_run_shows_what_was_sent_of_its_count_not_a_duration(tmp_path):
    cfg = RunConfig(out=str(tmp_path), concurrency=4, num_requests=200, rate=float("inf"), strategy="continuous",
                    backend="sim")  # a closed loop's rate is inf (build_config sets it)
    progress = Progress(cfg)
    (tmp_path / "progress.json").write_text('{"arrived": 40, "queued": 0, "in_flight": 4, "finished": 36, "failed": 0}')
    line = progress.text(2.0, {})
    assert "4 clients" in line and "sent 40 of 200" in line and " s of " not in line
    (tmp_path / "progress.json").write_text('{"arrived": 200, "queued": 0, "in_flight": 3, "finished": 197, "failed": 0}')
    progress.read_at = float("-inf")
    assert " draining " in progress.text(30.0, {})


def test_other_work_beside_a_run_is_shown_and_warned_about_past_a_quarter_of_a_core():
    from batchlab.cli.result_table import point_line, table

    busy = {"cores": 2, "window_s": 10.0, "other_cores": 1.02, "other_peak_cores": 1.1, "own_cores": 0.9,
            "steal_share": 0.0, "samples": 21, "disturbed": True}
    lines = warnings(_summary(interference=busy))
    assert any(ln.startswith("the machine was busy: other work 1.02 of 2 cores (peak 1.10)") for ln in lines)
    console = Console(record=True, width=120)
    console.print(table(_summary(interference=busy)))
    text = console.export_text()
    assert "other work on this machine (cores)" in text and "1.02 of 2 ⚠" in text
    assert point_line(_summary(interference=busy)).endswith("other work 1.02 cores ⚠")
    quiet = {**busy, "other_cores": 0.04, "other_peak_cores": 0.1, "disturbed": False}
    assert warnings(_summary(interference=quiet)) == [] and point_line(_summary(interference=quiet)).endswith(
        "other work 0.04 cores")
    assert "other work" not in point_line(_summary())  # a run recorded before batchlab metered it
