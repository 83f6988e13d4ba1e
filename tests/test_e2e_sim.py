"""End to end with real processes on the `sim` backend: conservation, metrics, strategies, Ctrl-C."""
import json
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from batchlab.collector.layout import point_dir

from tests.conftest import ROOT, default_sigint, run_cli

COMMON = ["--backend", "sim", "--dataset", "synthetic", "--max-new-tokens", "32", "--seed", "7"]

pytestmark = pytest.mark.slow  # real processes through the CLI


def read(out, name: str) -> pd.DataFrame:
    return pd.read_parquet(out / f"{name}.parquet")


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dyn")
    run_cli("run", *COMMON, "--strategy", "dynamic", "--rate", "20", "--duration", "3", "--out", str(out))
    return out


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


def test_at_low_load_dynamic_median_ttft_is_far_below_naive(tmp_path):
    ttft = {}
    for strategy in ("naive", "dynamic"):
        out = tmp_path / strategy
        run_cli("run", *COMMON, "--strategy", strategy, "--rate", "2", "--duration", "5", "--batch-size", "8",
                "--max-wait-ms", "20", "--out", str(out))
        ttft[strategy] = read(out, "requests").ttft.median()
    assert ttft["dynamic"] * 4 < ttft["naive"]


def test_continuous_strategy_streams_steps_and_finishes_everything(tmp_path):
    run_cli("run", *COMMON, "--strategy", "continuous", "--rate", "10", "--duration", "2", "--out", str(tmp_path))
    r, steps = read(tmp_path, "requests"), read(tmp_path, "steps")
    assert set(r.status) == {"finished"}
    assert steps.joined.sum() == len(r) and steps.finished.sum() == len(r)


def test_same_seed_gives_the_same_trace_for_every_strategy(tmp_path):
    hashes = set()
    for strategy in ("naive", "continuous"):
        out = tmp_path / strategy
        run_cli("run", *COMMON, "--strategy", strategy, "--rate", "10", "--duration", "1", "--out", str(out))
        hashes.add(pd.read_parquet(out / "schedule.parquet").to_json())
    assert len(hashes) == 1


def test_sigint_stops_every_process_and_leaves_readable_files(tmp_path):
    cmd = [sys.executable, "-m", "batchlab.cli.main", "run", *COMMON, "--strategy", "naive", "--batch-size", "4",
           "--rate", "10", "--duration", "30", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".parts/requests-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # wait until requests are finishing
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=90)
    assert proc.returncode != 0
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    schedule = pd.read_parquet(tmp_path / "schedule.parquet")
    assert sorted(requests.request_id) == sorted(schedule.request_id)
    assert (requests.status == "finished").any() and (requests.status == "failed").any()
    assert requests[requests.status == "failed"].error.str.len().min() > 0
    json.loads((tmp_path / "summary.json").read_text())


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
    run_cli("run", *COMMON, "--strategy", "dynamic", "--rate", "10", "--duration", "1", "--slo", "ttft=2s",
            "--slo", "e2e=60s", "--out", str(tmp_path / "run"))
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    met = int(((requests.status == "finished") & (requests.ttft <= 2.0) & (requests.e2e <= 60.0)).sum())
    goodput = json.loads((tmp_path / "run" / "summary.json").read_text())["goodput"]
    assert goodput["slos"] == {"ttft": 2.0, "e2e": 60.0} and goodput["met"] == met > 0
    config = tmp_path / "sweep.yaml"
    config.write_text("base: {backend: sim, dataset: synthetic, duration_s: 1, max_new_tokens: 8,\n"
                      "       slo: [ttft=500ms]}\ngrid: {strategies: [dynamic], rates: [5]}\n")
    run_cli("sweep", str(config), "--out", str(tmp_path / "sweep"))
    summary = json.loads((tmp_path / "sweep" / point_dir("dynamic", 5, 0) / "summary.json").read_text())
    assert summary["goodput"]["slos"] == {"ttft": 0.5}
