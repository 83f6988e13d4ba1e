"""End to end with real processes on the `sim` backend: conservation, metrics, strategies, goodput. The
runs go through the library call (the CLI's own process is only the subject of the bad-option tests);
the conservation tests read the session's shared run, and a run's Ctrl-C is tests/test_fault_matrix.py's."""
import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.collector.layout import point_dir

from tests.conftest import run_cli, sim_run

COMMON = {"max_new_tokens": 32, "seed": 7}

pytestmark = pytest.mark.slow  # real processes


def read(out, name: str) -> pd.DataFrame:
    return pd.read_parquet(out / f"{name}.parquet")


@pytest.fixture
def dynamic_run(dynamic_sim_run):
    return dynamic_sim_run  # dynamic at 20 req/s for 3 s, seed 7: the session's shared run


@pytest.fixture(scope="module")
def low_load(tmp_path_factory) -> dict:
    """naive and dynamic at 2 req/s for 5 s with the same seed: strategy → its run folder."""
    root = tmp_path_factory.mktemp("low")
    return {s: sim_run(root / s, **COMMON, strategy=s, rate=2, duration_s=5, batch_size=8, max_wait_ms=20)
            for s in ("naive", "dynamic")}


def test_every_scheduled_request_has_exactly_one_terminal_row(dynamic_run):
    schedule, requests = read(dynamic_run, "schedule"), read(dynamic_run, "requests")
    assert len(schedule) > 20
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert requests.request_id.is_unique
    assert set(requests.status) == {"finished"}


def test_tokens_table_has_one_row_per_output_token(dynamic_run):
    requests, tokens = read(dynamic_run, "requests"), read(dynamic_run, "tokens")
    counts = tokens.groupby("request_id").size()
    assert (counts.reindex(requests.request_id).to_numpy() == requests.output_len.to_numpy()).all()
    assert len(tokens) == requests.output_len.sum()


def test_latencies_are_ordered_and_measured_from_the_planned_arrival(dynamic_run):
    r, schedule = read(dynamic_run, "requests"), read(dynamic_run, "schedule")
    assert (r.queue_wait >= 0).all()
    assert (r.ttft >= r.queue_wait).all()
    assert (r.e2e >= r.ttft).all()
    planned = schedule.set_index("request_id").arrival_offset_s
    assert (r.set_index("request_id").arrival_time - planned).abs().max() < 1e-9


def test_summary_is_consistent_with_the_tables(dynamic_run):
    s = json.loads((dynamic_run / "summary.json").read_text())
    r = read(dynamic_run, "requests")
    assert s["submitted"] == s["finished"] == len(r)
    assert s["ttft"]["p50"] == pytest.approx(r.ttft.median())
    assert s["throughput_tok_s"] == pytest.approx(r.output_len.sum() / s["window_s"])
    assert s["settings"]["strategy"] == "dynamic"


def test_batches_record_reason_and_their_requests(dynamic_run):
    b, r = read(dynamic_run, "batches"), read(dynamic_run, "requests")
    assert set(b.launch_reason) <= {"size", "age", "memory", "flush"}
    assert b["size"].sum() == len(r)
    assert ((b.useful_fraction > 0) & (b.useful_fraction <= 1)).all()


def test_at_low_load_dynamic_median_ttft_is_far_below_naive(low_load):
    ttft = {strategy: read(out, "requests").ttft.median() for strategy, out in low_load.items()}
    assert ttft["dynamic"] * 4 < ttft["naive"]


def test_continuous_strategy_streams_steps_and_finishes_everything(tmp_path):
    sim_run(tmp_path, **COMMON, strategy="continuous", rate=10, duration_s=2)
    r, steps = read(tmp_path, "requests"), read(tmp_path, "steps")
    assert set(r.status) == {"finished"}
    assert steps.joined.sum() == len(r) and steps.finished.sum() == len(r)


def test_same_seed_gives_the_same_trace_for_every_strategy(low_load):
    frames = [pd.read_parquet(out / "schedule.parquet") for out in low_load.values()]  # two separate runs
    assert len(frames[0]) > 0 and frames[0].to_json() == frames[1].to_json()


@pytest.mark.parametrize("args, message", [
    (["--rate", "0"], "--rate must be > 0"),
    (["--strategy", "fastest"], "unknown strategy"),
    (["--strategy", "naive", "--strategy-arg", "max_wait_ms=5"], "naive has no parameter max_wait_ms"),
    (["--config", "/nonexistent.yaml"], "does not exist"),
    (["--memory-budget", "lots"], "cannot read 'lots' as a size"),
])
def test_bad_options_print_one_line_and_exit_1(args, message):
    proc = run_cli("run", *args, check=False, timeout_s=60)
    assert proc.returncode == 1
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_slos_given_to_run_and_to_a_sweep_put_goodput_in_the_summary(tmp_path):
    sim_run(tmp_path / "run", **COMMON, strategy="dynamic", rate=10, duration_s=1, slo=["ttft=2s", "e2e=60s"])
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    met = int(((requests.status == "finished") & (requests.ttft <= 2.0) & (requests.e2e <= 60.0)).sum())
    goodput = json.loads((tmp_path / "run" / "summary.json").read_text())["goodput"]
    assert goodput["slos"] == {"ttft": 2.0, "e2e": 60.0} and goodput["met"] == met > 0
    config = tmp_path / "sweep.yaml"
    config.write_text("base: {backend: sim, dataset: synthetic, duration_s: 1, max_new_tokens: 8,\n"
                      "       slo: [ttft=500ms]}\ngrid: {strategies: [dynamic], rates: [5]}\n")
    result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "sweep" / point_dir("dynamic", 5, 0) / "summary.json").read_text())
    assert summary["goodput"]["slos"] == {"ttft": 0.5}
