"""Timing fidelity: live sim runs against the simulator on the same schedule, a post-processing step
over finished run folders that never breaks its caller."""
import json
import math

import pandas as pd
import pytest

from batchlab.runner.launcher import launch_run
from batchlab.lab.simulate import simulate_run
from batchlab.collector.store import RunStore
from batchlab.collector.summary import write_summary
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.simulator.fidelity import add_run_fidelity, compare, config_from_settings
from batchlab.protocol import Arrival, RequestMsg
from tests.wire_cases import launch, tokens

ERROR_KEYS = ("ttft_error_s", "tpot_error_s", "e2e_error_s", "queue_wait_error_s")


def _requests(ttft: list[float], tpot: list[float], status: str = "finished") -> pd.DataFrame:
    n = len(ttft)
    return pd.DataFrame({"request_id": range(n), "status": [status] * n, "ttft": ttft, "tpot": tpot,
                         "e2e": ttft, "queue_wait": [0.0] * n})


def test_errors_are_live_minus_simulated_per_request_id():
    live = _requests([0.010, 0.020, 0.030], [0.001, 0.001, 0.001])
    sim = _requests([0.009, 0.020, 0.025], [0.001, 0.0005, 0.001]).iloc[::-1]  # order must not matter
    out = compare(live, sim)
    assert out["matched"] == 3 and out["live_only"] == out["sim_only"] == 0
    assert out["ttft_error_s"]["max_abs"] == pytest.approx(0.005)
    assert out["ttft_error_s"]["p50"] == pytest.approx(0.001)
    assert out["tpot_error_s"]["mean"] == pytest.approx(0.0005 / 3)


def test_unfinished_requests_are_not_matched():
    live = _requests([0.01, 0.02], [0.001, 0.001])
    live.loc[1, "status"] = "failed"
    assert compare(live, _requests([0.01, 0.02], [0.001, 0.001]))["matched"] == 1


def test_settings_become_a_run_config_with_the_worker_count():
    cfg = config_from_settings({"backend": "sim", "rate": 5.0, "t0": 12.0, "host": "h",
                                "workers": {"worker-0": {}, "worker-1": {}}})
    assert (cfg.backend, cfg.rate, cfg.workers) == ("sim", 5.0, 2)


def test_recorded_settings_are_checked_like_any_config():
    with pytest.raises(ConfigError, match="rate"):
        config_from_settings({"backend": "sim", "rate": -1.0})


def test_a_failing_simulation_is_logged_not_raised(tmp_path, caplog):
    _simulated_folder(tmp_path, live=True)
    pd.DataFrame({"request_id": [0]}).to_parquet(tmp_path / "schedule.parquet")  # no arrival offsets: it fails
    assert add_run_fidelity(tmp_path) is None
    assert "timing_fidelity" not in json.loads((tmp_path / "summary.json").read_text())
    assert "timing fidelity skipped" in caplog.text


def test_other_backends_get_no_fidelity_block(tmp_path):
    _simulated_folder(tmp_path, live=True, backend="hf")
    assert add_run_fidelity(tmp_path) is None
    assert "timing_fidelity" not in json.loads((tmp_path / "summary.json").read_text())


def test_step_tokens_that_overtake_their_launch_are_kept_under_their_stated_batch():
    store = RunStore()
    store.handle(tokens(3, 0, 1.5, [7], [42]))  # the worker's token beat the scheduler's messages
    assert store.counters["ignored_tokens"] == 0 and store.tokens[(7, 3)] == [(1.5, 42)]
    store.handle(Arrival(RequestMsg(7, 1.0, 1.0, 4, 2), 1.1))
    store.handle(launch(3, "worker-0", 1.2, "credit", [7]))
    store.handle(tokens(3, 1, 1.6, [7], [43]))
    assert store.tokens[(7, 3)] == [(1.5, 42), (1.6, 43)]
    assert store.counters["ignored_tokens"] == 0


def _simulated_folder(folder, *, live: bool, backend: str = "sim") -> None:
    """A simulated run's folder; with `live`, its settings claim a live run (its simulation is then exact)."""
    cfg = RunConfig(backend="sim", strategy="dynamic", dataset="synthetic", rate=20, duration_s=1.0,
                    max_new_tokens=8, seed=1, out=str(folder)).validate()
    summary = simulate_run(cfg)
    if live:
        summary.settings.update(simulated=False, backend=backend)
        write_summary(folder, summary)


def test_a_run_folder_gains_its_fidelity_block_once(tmp_path):
    _simulated_folder(tmp_path, live=True)
    fidelity = add_run_fidelity(tmp_path)
    assert fidelity["matched"] > 0 and fidelity["ttft_error_s"]["max_abs"] == pytest.approx(0.0, abs=1e-9)
    assert json.loads((tmp_path / "summary.json").read_text())["timing_fidelity"] == fidelity
    assert add_run_fidelity(tmp_path) == fidelity  # kept, not computed again


def test_simulated_runs_and_folders_without_runs_get_no_block(tmp_path):
    _simulated_folder(tmp_path / "simulated", live=False)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{not json")
    assert add_run_fidelity(tmp_path / "simulated") is None and add_run_fidelity(tmp_path / "broken") is None
    assert "timing_fidelity" not in json.loads((tmp_path / "simulated" / "summary.json").read_text())


def test_the_collector_leaves_fidelity_to_post_processing():
    import batchlab.collector.process as process

    assert "fidelity" not in process.__dict__ and not hasattr(process, "add_run_fidelity")


@pytest.mark.slow
def test_a_short_sim_run_reports_small_timing_errors(tmp_path):
    cfg = RunConfig(backend="sim", strategy="continuous", dataset="synthetic", rate=20, duration_s=1.5,
                    max_new_tokens=16, seed=3, out=str(tmp_path)).validate()
    summary = launch_run(cfg)
    fidelity = summary.timing_fidelity  # computed once, when the run ended
    assert add_run_fidelity(tmp_path) == fidelity  # and not again
    assert fidelity["backend"] == "sim"
    assert fidelity["matched"] == summary.finished > 0
    assert all(set(fidelity[k]) == {"mean", "p50", "p99", "max_abs"} for k in ERROR_KEYS)
    # Margins from the run itself, not from a quiet machine: on a busy machine every sleep of the sim worker
    # ends late, so the live run is slower than the model by some part of each step; a frame or matching
    # bug (a wrong t0, rows paired with other requests) is off by the run's own scale instead.
    assert abs(fidelity["tpot_error_s"]["p50"]) < 0.75 * summary.tpot.p50  # < 3 × the model's TPOT
    assert abs(fidelity["ttft_error_s"]["p50"]) < cfg.duration_s / 3
    assert not math.isnan(fidelity["sim_wall_s"])


@pytest.mark.slow
def test_batchlab_report_leaves_every_run_file_byte_identical(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    _simulated_folder(tmp_path, live=True)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert all(p.read_bytes() == data for p, data in before.items())
    added = {p.name for p in tmp_path.rglob("*") if p.is_file() and p not in before}
    assert "REPORT.md" in added and all(n.startswith("REPORT.") or n.endswith(".png") for n in added)
    assert "timing_fidelity" not in json.loads((tmp_path / "summary.json").read_text())  # the run's to write


@pytest.mark.slow
def test_report_out_puts_the_report_elsewhere(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    _simulated_folder(tmp_path / "run", live=True)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "REPORT.md").is_file() and not (tmp_path / "run" / "REPORT.md").exists()


@pytest.mark.parametrize("bound, value, requests", [("MAX_SIMULATED_REQUESTS", 8, 8),
                                                    ("MAX_SIMULATED_TOKENS", 40, None)])
def test_a_long_run_is_compared_on_a_prefix_of_its_schedule_exactly(tmp_path, monkeypatch, bound, value, requests):
    """The prefix simulated alone plays what the whole did until its last arrival: the requests it completes
    before then match the whole run's to the nanosecond, and no more of the run is simulated (a prefix of at
    most so many requests, or so many output tokens)."""
    from batchlab.simulator import fidelity

    _simulated_folder(tmp_path, live=True)
    schedule = pd.read_parquet(tmp_path / "schedule.parquet")
    monkeypatch.setattr(fidelity, bound, value)
    block = add_run_fidelity(tmp_path)
    prefix = schedule.iloc[:block["simulated_requests"]]
    assert block["simulated_requests"] < len(schedule) and 0 < block["matched"] <= len(prefix)
    assert block["simulated_requests"] == requests if requests else prefix["output_len"].sum() <= value
    assert block["live_only"] == block["sim_only"] == 0
    for key in ERROR_KEYS:
        assert block[key]["max_abs"] == pytest.approx(0.0, abs=1e-9)
