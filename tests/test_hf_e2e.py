"""`batchlab run --backend hf` end to end on tiny-mistral (CPU): traffic → scheduler → HF worker → collector."""
import json

import pandas as pd
import pytest

from tests.conftest import HF_RUN as COMMON, run_cli

pytestmark = pytest.mark.slow


def read(out, table: str) -> pd.DataFrame:
    return pd.read_parquet(out / f"{table}.parquet")


@pytest.fixture
def runs(hf_static_runs):
    """The same trace under naive and dynamic batching (tests/conftest.py: shared with the GPU check)."""
    return hf_static_runs


def test_every_request_gets_exactly_its_target_tokens(runs):
    for out in runs.values():
        r, t = read(out, "requests"), read(out, "tokens")
        assert len(r) > 0 and (r.status == "finished").all()
        counts = t.groupby("request_id").size().reindex(r.request_id, fill_value=0)
        assert (counts.to_numpy() == r.output_len.to_numpy()).all()
        assert (t.groupby("request_id").token_index.max() + 1).reindex(r.request_id).tolist() == r.output_len.tolist()


def test_token_times_strictly_increase_and_follow_scheduling(runs):
    r, t = read(runs["dynamic"], "requests"), read(runs["dynamic"], "tokens")
    for _, group in t.sort_values(["request_id", "token_index"]).groupby("request_id"):
        assert group.time.diff().dropna().gt(0).all()
    assert (r.first_token_time > r.scheduled_time).all()


def test_naive_and_dynamic_complete_the_same_trace(runs):
    schedules = {s: read(out, "schedule").to_json() for s, out in runs.items()}
    assert schedules["naive"] == schedules["dynamic"]
    done = {s: sorted(read(out, "requests").query("status == 'finished'").request_id) for s, out in runs.items()}
    assert done["naive"] == done["dynamic"] and len(done["naive"]) == len(read(runs["naive"], "schedule"))


def test_small_memory_budget_fires_the_memory_trigger(runs):
    b, r = read(runs["dynamic"], "batches"), read(runs["dynamic"], "requests")
    assert "memory" in set(b.launch_reason)
    assert (r.status == "finished").all() and b["size"].sum() == len(r)


def test_oom_halves_the_cap_and_loses_no_request(tmp_path):
    # 16 KiB of KV per token: four padded rows of a ~100-token prompt exceed 6 MiB, two rows never do
    run_cli("run", *COMMON, "--strategy", "naive", "--batch-size", "4", "--rate", "8", "--duration", "2",
            "--max-prompt-len", "128", "--memory-budget", "6MiB", "--strict-memory", "--out", str(tmp_path))
    batches, requests = read(tmp_path, "batches"), read(tmp_path, "requests")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert batches.oom.any() and summary["scheduler_stats"]["oom_batches"] == batches.oom.sum()
    first_oom = batches[batches.oom].scheduled_time.min()
    after = batches[(batches.scheduled_time > first_oom) & ~batches.oom]
    assert len(after) and after["size"].max() <= 2
    assert set(requests.status) == {"finished"}
    assert (requests.n_tokens == requests.output_len).all()


def test_the_run_records_its_thread_plan_and_the_machine_beside_it(runs):
    """The worker's facts name the thread policy it ran with (auto: cores − 1 threads, idle threads
    sleeping), and the summary how much CPU the rest of the machine used meanwhile."""
    from batchlab.worker.threads import AUTO_POLICY, plan

    summary = json.loads((runs["naive"] / "summary.json").read_text())
    facts = next(iter(summary["settings"]["workers"].values()))
    expected = plan(AUTO_POLICY)
    assert facts["thread_policy"] == "auto" and facts["intra_op_threads"] == expected.threads
    assert facts["torch_threads"] == expected.threads  # read back in the worker's process
    assert facts["omp_wait_policy"] == "passive"
    beside = summary["interference"]
    assert beside["cores"] >= 1 and beside["samples"] >= 2 and beside["other_cores"] >= 0
    assert beside["own_cores"] > 0  # the run's own processes worked
