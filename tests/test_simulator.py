"""The simulator on the five-request example (room for 4 rows; arrivals at steps 0, 1, 5, 6, 7 needing
6, 3, 4, 2, 5 decode steps), and its fast table route against the collector's.

Mapping of that step-time example onto the step model: every step lasts exactly 1 s (overhead
1 s, no weights, no KV traffic, free prefill tokens) and the prefill counts as a step, so a request
"needing k decode steps" has output_len k: its first token ends the prefill step, then one token per
further step. In continuous mode ContinuousCore runs the joiners' prefill inside the step that also
decodes the running rows, so such a mixed step lasts 1 s (decode) + 1 s (prefill) = 2 s here, and the
example's integer arrivals tie with step ends (see the continuous test for how ties resolve).
"""
from dataclasses import replace

import pandas as pd
import pytest

from batchlab.collector.store import RunStore
from batchlab.collector.tables import build_tables
from batchlab.protocol import WorkerHello
from batchlab.scheduler.policies import Continuous, Dynamic, Naive
from batchlab.simulator.run import Simulation
from batchlab.worker.stepmodel import StepModel

ARRIVALS_S = [0, 1, 5, 6, 7]
NEEDS = [6, 3, 4, 2, 5]
NAMES = "ABCDE"
ROOM = 4
UNIT = StepModel("unit-steps", 0.0, 0, 1.0, 0.0, overhead_s=1.0, memory_bytes=1e15)


def seed_frame() -> pd.DataFrame:
    return pd.DataFrame({"request_id": range(5), "arrival_offset_s": [float(a) for a in ARRIVALS_S],
                         "prompt_len": [1] * 5, "output_len": NEEDS})


def hello(mode: str, worker_id: str = "worker-0") -> WorkerHello:
    return WorkerHello(worker_id, "sim", UNIT.name, mode, ROOM, 0, UNIT.kv_budget_bytes(), "simulated", "none")


def simulate(policy, frame: pd.DataFrame | None = None, workers: int = 1):
    frame = seed_frame() if frame is None else frame
    hellos = [hello(policy.mode, f"worker-{i}") for i in range(workers)]
    sim = Simulation(policy, UNIT, hellos, frame, settings={"strategy": policy.name})
    store = sim.run()
    tokens = sim.recorder.attach(store)
    return sim, build_tables(store.view(), frame, None, tokens=tokens)


def launches(tables) -> list[tuple[float, str, str, float]]:
    b = tables.batches.sort_values("batch_id")
    members = tables.requests.groupby("batch_id")["request_id"].apply(lambda s: "".join(NAMES[i] for i in s))
    return [(r.scheduled_time, members[r.batch_id], r.launch_reason, r.completion_time) for r in b.itertuples()]


def test_naive_launches_abcd_at_6_on_size_and_flushes_e_at_12():
    _, tables = simulate(Naive(batch_size=4))
    assert launches(tables) == [(6.0, "ABCD", "size", 12.0), (12.0, "E", "flush", 17.0)]


def test_dynamic_launches_ab_at_2_and_cde_at_8_on_age():
    _, tables = simulate(Dynamic(max_batch_size=4, max_wait_s=2.0, max_new_tokens=8))
    assert launches(tables) == [(2.0, "AB", "age", 8.0), (8.0, "CDE", "age", 13.0)]


def test_static_tokens_come_one_per_step_after_the_prefill():
    _, tables = simulate(Naive(batch_size=4))
    times = tables.tokens.groupby("request_id")["time"].apply(list)
    assert times[0] == [7.0, 8.0, 9.0, 10.0, 11.0, 12.0]  # A: prefill 6→7, then one token a step
    assert times[3] == [7.0, 8.0]  # D needs 2
    assert times[4] == [13.0, 14.0, 15.0, 16.0, 17.0]


def test_continuous_starts_each_request_at_its_arrival_and_frees_it_when_done():
    _, tables = simulate(Continuous(max_batch_size=ROOM))
    r = tables.requests.set_index("request_id")
    assert r["scheduled_time"].tolist() == ARRIVALS_S
    assert r["n_tokens"].tolist() == NEEDS
    # A busy worker starts its next step the moment one ends, with the rows it already holds (as
    # worker/process.py does), so a row dispatched at that very instant joins the step after:
    # [0,1) A prefill; [1,2) A (B dispatched at 1); [2,4) A + B prefill; [4,5); [5,6) B done;
    # [6,8) A done + C prefill; [8,10) C + D, E prefill; [10,11) D done; [11,12) C done; [12,13) [13,14) E
    assert r["first_token_time"].tolist() == [1.0, 4.0, 8.0, 10.0, 10.0]
    assert r["completion_time"].tolist() == [8.0, 6.0, 12.0, 11.0, 14.0]
    assert (tables.batches["size"] == 1).all()


def test_continuous_steps_table_counts_joins_and_finishes():
    _, tables = simulate(Continuous(max_batch_size=ROOM))
    s = tables.steps
    assert s["joined"].sum() == 5 and s["finished"].sum() == 5
    assert s["running"].max() <= ROOM
    assert (s["start_time"].iloc[1:].to_numpy() == s["end_time"].iloc[:-1].to_numpy()).all()


def test_two_static_workers_take_batches_side_by_side():
    _, tables = simulate(Dynamic(max_batch_size=4, max_wait_s=2.0, max_new_tokens=8), workers=2)
    b = tables.batches.sort_values("batch_id")
    assert b["worker"].tolist() == ["worker-0", "worker-1"]  # CDE need not wait for AB to finish
    assert b["scheduled_time"].tolist() == [2.0, 7.0]


def test_dynamic_wakes_at_the_oldest_requests_deadline_with_no_other_event():
    frame = pd.DataFrame({"request_id": [0, 1], "arrival_offset_s": [0.0, 5.0], "prompt_len": [1, 1],
                          "output_len": [3, 1]})
    _, tables = simulate(Dynamic(max_batch_size=4, max_wait_s=0.5, max_new_tokens=8), frame)
    assert launches(tables) == [(0.5, "A", "age", 3.5), (5.0, "B", "flush", 6.0)]


class _LoggingStore(RunStore):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[object] = []

    def handle(self, msg: object) -> None:
        self.log.append(msg)
        super().handle(msg)


@pytest.mark.parametrize("policy,model", [(Naive(3), UNIT), (Dynamic(4, 1.5, 8), UNIT), (Continuous(ROOM), UNIT),
                                          (Continuous(ROOM), replace(UNIT, prefill_alone=True))],
                         ids=["naive", "dynamic", "continuous", "continuous-v0"])
def test_fast_tables_equal_the_collectors_own_from_token_messages(policy, model):
    frame = pd.DataFrame({"request_id": range(12), "arrival_offset_s": [0.3 * i for i in range(12)],
                          "prompt_len": [1 + i % 3 for i in range(12)],
                          "output_len": [1 + (5 * i) % 7 for i in range(12)]})
    hellos = [hello(policy.mode)]
    sim = Simulation(policy, model, hellos, frame, settings={"strategy": policy.name})
    sim.store = _LoggingStore()
    store = sim.run()
    fast = build_tables(store.view(), frame, {"ttft": 3.0}, tokens=sim.recorder.attach(store))
    slow_store = RunStore()
    for msg in sim.store.log[:-2] + sim.recorder.token_messages() + sim.store.log[-2:]:
        slow_store.handle(msg)
    slow = slow_store.finish(frame, slos={"ttft": 3.0})
    assert (fast.steps is None) == (slow.steps is None) == (policy.mode == "static")
    for name in ("requests", "tokens", "batches") + (("steps",) if fast.steps is not None else ()):
        pd.testing.assert_frame_equal(getattr(fast, name), getattr(slow, name))
    assert fast.summary == slow.summary


def test_arrivals_beyond_max_queue_fail_as_queue_full_like_the_live_scheduler():
    policy = Dynamic(max_batch_size=4, max_wait_s=2.0, max_new_tokens=8)
    sim = Simulation(policy, UNIT, [hello("static")], seed_frame(), settings={}, max_queue=1)
    store = sim.run()
    tables = build_tables(store.view(), seed_frame(), None, tokens=sim.recorder.attach(store))
    r = tables.requests.set_index("request_id")
    assert r["status"].tolist() == ["finished", "failed", "finished", "failed", "failed"]  # B, D, E find A or C queued
    assert set(r.loc[[1, 3, 4], "error"]) == {"queue full"}
    assert launches(tables) == [(2.0, "A", "age", 8.0), (8.0, "C", "age", 12.0)]


def test_a_policy_that_never_launches_is_declared_stalled_in_virtual_time_like_a_live_run():
    from tests.fault_plugins import Never

    sim = Simulation(Never(), UNIT, [hello("static")], seed_frame(), settings={}, stall_limit_s=2.0)
    store = sim.run()
    tables = build_tables(store.view(), seed_frame(), None, tokens=sim.recorder.attach(store))
    r = tables.requests
    assert set(r.status) == {"failed"} and set(r.error) == {
        "stalled: policy launched nothing for 2 s with 5 queued and every worker idle"}
    assert sim.core.stats["stalled"] == 5


def test_a_vllm_run_holds_max_num_seqs_rows_as_the_live_vllm_worker_announces():
    from batchlab.protocol.settings import RunConfig
    from batchlab.scheduler.strategies import resolve
    from batchlab.simulator.run import sim_worker

    vllm = RunConfig(strategy="vllm", max_batch_size=8, max_num_seqs=64, out=".")
    assert sim_worker(vllm, resolve(vllm)).info.max_batch_size == 64
    unset = RunConfig(strategy="vllm", max_batch_size=8, out=".")
    assert sim_worker(unset, resolve(unset)).info.max_batch_size == 8  # 0: the row cap, as live
    hf = RunConfig(strategy="continuous", max_batch_size=8, max_num_seqs=64, out=".")
    assert sim_worker(hf, resolve(hf)).info.max_batch_size == 8  # not a vllm run: its own row cap


def test_vllm_v0_steps_run_a_waiting_prompt_alone_and_the_running_rows_wait():
    """vLLM V0 (prefill_alone: worker.vllm_v0): a step with a dispatched prompt prefills only it. [0,1) A prefill;
    [1,2) A (B dispatched at 1); [2,3) B prefill, A waits; [3,4) [4,5) A + B, B done; [5,6) A (C dispatched at 5);
    [6,7) C prefill; [7,8) D prefill; [8,9) E prefill; [9,10) A, C, D, E: A and D done; [10,11); [11,12) C done;
    [12,13) E done."""
    hellos = [hello("continuous")]
    frame = seed_frame()
    sim = Simulation(Continuous(max_batch_size=ROOM), replace(UNIT, prefill_alone=True), hellos, frame,
                     settings={"strategy": "continuous"})
    store = sim.run()
    tables = build_tables(store.view(), frame, None, tokens=sim.recorder.attach(store))
    r = tables.requests.set_index("request_id")
    assert r["first_token_time"].tolist() == [1.0, 3.0, 7.0, 8.0, 9.0]
    assert r["completion_time"].tolist() == [10.0, 5.0, 12.0, 10.0, 13.0]
    assert r["n_tokens"].tolist() == NEEDS
    times = tables.tokens.groupby("request_id")["time"].apply(list)
    assert times[0] == [1.0, 2.0, 4.0, 5.0, 6.0, 10.0]  # A skips the prompt-only steps [2,3) [6,7) [7,8) [8,9)


@pytest.mark.parametrize("strategy", ["naive", "dynamic", "continuous"])
def test_a_probes_requests_table_alone_is_the_full_runs(strategy):
    from batchlab.runner.preflight import checked_config
    from batchlab.simulator.run import simulate as simulate_run, simulate_requests
    from batchlab.traffic.run_schedule import make_schedule

    cfg = checked_config({"backend": "sim", "strategy": strategy, "rate": 30.0, "duration_s": 20, "max_queue": 16,
                          "dataset": "synthetic", "out": "."}, {})
    schedule = make_schedule(cfg)
    alone = simulate_requests(cfg, schedule)
    pd.testing.assert_frame_equal(alone, simulate_run(cfg, schedule).requests)
    assert (alone["status"] != "finished").any()  # the queue limit refused some: not only the easy rows
