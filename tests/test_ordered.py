"""sjf and edf: policies that pick among the queued; the core carrying out picks and rejections; and the
queueing-theory check that shortest-job-first with the oracle lowers the mean latency at the same load."""
import json

import pytest

from batchlab.protocol import RequestMsg, WorkerHello
from batchlab.protocol.settings import ConfigError, build_config
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.ordered import EDF, SJF, EDFParams, SJFParams, _normal
from batchlab.scheduler.policies import Capacity, Decision
from batchlab.scheduler.strategies import resolve
from batchlab.simulator.run import simulate
from batchlab.traffic.run_schedule import make_schedule
from tests.conftest import sim_run

BIG_KV = 10**12
ROOMY = Capacity(free_slots=8, kv_free_bytes=BIG_KV, kv_bytes_per_token=1, idle=True)


def req(rid: int, t: float = 0.0, prompt_len: int = 4, output_len: int = 4) -> RequestMsg:
    return RequestMsg(rid, t, t, prompt_len, output_len)


def core_with(policy, mode: str, rows: int = 8) -> SchedulerCore:
    core = SchedulerCore(policy)
    core.on_hello("w0", WorkerHello("w0", "sim", "fake", mode, rows, 1, BIG_KV, "cpu", "none"), 0.0)
    return core


class Scripted:
    """A policy that answers one fixed decision (to drive the core's pick/reject rules)."""

    name, mode = "scripted", "static"

    def __init__(self, decision: Decision, lookahead: int = 0) -> None:
        self.decision, self.lookahead = decision, lookahead

    def decide(self, queue, now, cap, end_of_stream) -> Decision:
        decision, self.decision = self.decision, Decision()
        return decision

    def on_batch_done(self, size: int, oom: bool) -> None:
        pass


# --- the core carries out picks and rejections -----------------------------------------------------
def test_the_core_launches_the_picked_positions_in_order_and_keeps_the_rest_in_theirs():
    core = core_with(Scripted(Decision(reason="x", pick=(3, 1), reject=(0,), reject_reason="deadline")), "static")
    for rid in range(5):
        core.on_request(req(rid), 0.0)
    decisions = core.schedule(1.0)
    assert [[r.request_id for r in launch.requests] for launch in decisions.launches] == [[3, 1]]
    assert [r.request_id for r in core.queue] == [2, 4] and core.queue.tokens == 2 * 8
    assert {f.request_id: f.reason for f in core.drain()} == {0: "deadline"}


def test_the_core_shows_a_policy_its_lookahead_beyond_the_workers_rows():
    seen = []

    class Peek(Scripted):
        def decide(self, queue, now, cap, end_of_stream):
            seen.append(len(queue))
            return Decision()

    core = core_with(Peek(Decision(), lookahead=50), "static", rows=2)
    for rid in range(100):
        core.on_request(req(rid), 0.0)
    core.schedule(0.0)
    assert seen == [50]


@pytest.mark.parametrize("decision", [Decision(pick=(0, 0)), Decision(pick=(9,)), Decision(pick=(1,), reject=(1,))])
def test_a_decision_naming_a_position_twice_or_outside_what_it_saw_is_a_policy_bug(decision):
    core = core_with(Scripted(decision), "static")
    for rid in range(3):
        core.on_request(req(rid), 0.0)
    with pytest.raises(ValueError, match="distinct positions"):
        core.schedule(0.0)


# --- sjf --------------------------------------------------------------------------------------------
def test_sjf_with_the_oracle_admits_the_shortest_outputs_first():
    sjf = SJF(SJFParams(mode="continuous", max_batch_size=2))
    queue = [req(0, output_len=90), req(1, output_len=10), req(2, output_len=50), req(3, output_len=5)]
    assert sjf.decide(queue, 0.0, ROOMY, False).pick == (3, 1)


def test_sjf_static_forms_its_batch_from_the_shortest_and_keeps_dynamics_triggers():
    sjf = SJF(SJFParams(max_batch_size=2, max_wait_ms=100))
    queue = [req(0, output_len=90), req(1, output_len=10), req(2, output_len=50)]
    decision = sjf.decide(queue, 0.0, ROOMY, False)
    assert (decision.pick, decision.reason) == ((1, 2), "size")
    lone = sjf.decide([req(0, t=1.0)], 1.0, ROOMY, False)
    assert lone.pick == () and lone.wake_at == pytest.approx(1.1)


def test_sjf_serves_a_request_past_the_aging_bound_before_any_shorter_younger_one():
    sjf = SJF(SJFParams(mode="continuous", max_batch_size=1, max_age_ms=1000))
    queue = [req(0, t=0.0, output_len=500), req(1, t=1.5, output_len=1)]
    assert sjf.decide(queue, 0.5, ROOMY, False).pick == (1,)  # not yet aged: the short one first
    assert sjf.decide(queue, 1.6, ROOMY, False).pick == (0,)  # aged: it goes first


def test_sjf_predictors_prompt_and_noisy():
    long_prompt_short_output, short_prompt_long_output = req(0, prompt_len=900, output_len=5), req(1, prompt_len=5,
                                                                                                       output_len=900)
    queue = [long_prompt_short_output, short_prompt_long_output]
    assert SJF(SJFParams(mode="continuous", max_batch_size=1, predictor="prompt")).decide(queue, 0, ROOMY, False).pick == (1,)
    exact = SJF(SJFParams(predictor="noisy", noise=0.0))
    noisy = SJF(SJFParams(predictor="noisy", noise=1.0, seed=3))
    assert exact.predict(req(7, output_len=100)) == 100.0
    guesses = [noisy.predict(req(rid, output_len=100)) for rid in range(200)]
    assert guesses == [noisy.predict(req(rid, output_len=100)) for rid in range(200)]  # replays exactly
    assert len(set(guesses)) == 200 and min(guesses) < 50 < 200 < max(guesses)
    draws = [_normal(0, rid) for rid in range(4000)]
    assert abs(sum(draws) / len(draws)) < 0.1 and 0.9 < sum(d * d for d in draws) / len(draws) < 1.1


# --- edf --------------------------------------------------------------------------------------------
def test_edf_orders_by_deadline_and_with_a_tpot_slo_a_short_job_is_due_sooner():
    edf = EDF(EDFParams(mode="continuous", max_batch_size=1, slo=["ttft=1000ms", "tpot=10ms"]))
    queue = [req(0, t=0.0, output_len=500), req(1, t=0.5, output_len=2)]  # due 5.99 s vs 1.51 s
    assert edf.decide(queue, 0.6, ROOMY, False).pick == (1,)
    fcfs = EDF(EDFParams(mode="continuous", max_batch_size=1, ttft_slo_ms=1000))  # no TPOT SLO: FCFS
    assert fcfs.decide(queue, 0.6, ROOMY, False).pick == (0,)


def test_edf_rejects_what_missed_its_ttft_deadline_and_the_core_fails_it_as_deadline():
    edf = EDF(EDFParams(mode="continuous", max_batch_size=4, ttft_slo_ms=500, reject_late=True))
    core = core_with(edf, "continuous")
    core.on_request(req(0, t=0.0), 0.0)
    core.on_request(req(1, t=0.8), 0.8)
    decisions = core.schedule(1.0)
    assert [[r.request_id for r in launch.requests] for launch in decisions.launches] == [[1]]
    assert {f.request_id: f.reason for f in core.drain()} == {0: "deadline"}


def test_edf_without_a_ttft_slo_and_bad_parameters_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="edf needs a TTFT SLO"):
        resolve(build_config({"strategy": "edf"}, {}))
    with pytest.raises(ConfigError, match="predictor must be one of"):
        resolve(build_config({"strategy": "sjf", "strategy_args": {"predictor": "psychic"}}, {}))
    with pytest.raises(ConfigError, match="mode must be one of"):
        resolve(build_config({"strategy": "sjf", "strategy_args": {"mode": "sometimes"}}, {}))


def test_the_workers_mode_follows_the_mode_parameter_and_the_slo_comes_from_the_run():
    cfg = build_config({"strategy": "edf", "slo": ["ttft=250ms"], "max_batch_size": 6,
                        "strategy_args": {"mode": "continuous"}}, {})
    strategy = resolve(cfg)
    assert (strategy.name, strategy.mode, strategy.rows) == ("edf", "continuous", 6)
    assert strategy.policy().ttft_s == 0.25
    assert resolve(build_config({"strategy": "sjf"}, {})).mode == "static"


# --- queueing theory, in the simulator --------------------------------------------------------------
@pytest.mark.parametrize("fcfs, mode", [("dynamic", "static"), ("continuous", "continuous")])
def test_sjf_with_the_oracle_gives_a_lower_mean_e2e_than_fcfs_at_the_same_load(fcfs, mode):
    base = {"backend": "sim", "preset": "a100-llama2-7b", "dataset": "synthetic", "rate": 5.0, "duration_s": 60.0,
            "prompt_lengths": "32-256", "output_lengths": "8-512", "max_new_tokens": 512, "max_batch_size": 8,
            "seed": 1}
    schedule = make_schedule(build_config(base, {}))
    results = {}
    for name, extra in [(fcfs, {}), ("sjf", {"strategy_args": {"mode": mode, "max_age_ms": 60_000}})]:
        tables = simulate(build_config({**base, "strategy": name, **extra}, {}), schedule)
        assert tables.summary.finished == schedule.n_requests  # the same load, all of it served
        results[name] = tables.summary.e2e.mean
    assert results["sjf"] < 0.9 * results[fcfs], results


# --- live, through the ZeroMQ scheduler -------------------------------------------------------------
@pytest.mark.slow
def test_sjf_and_edf_run_live_and_every_request_ends_once(tmp_path):
    common = {"preset": "a100-llama2-7b", "rate": 40, "duration_s": 2, "max_batch_size": 4}  # through the library
    sim_run(tmp_path / "sjf", **common, strategy="sjf", strategy_args=["mode=continuous"])
    sim_run(tmp_path / "edf", **common, strategy="edf", slo=["ttft=100ms"], strategy_args=["reject_late=true"])
    import pandas as pd

    for name in ("sjf", "edf"):
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        requests = pd.read_parquet(tmp_path / name / "requests.parquet")
        assert summary["settings"]["strategy"] == name
        assert requests.request_id.is_unique and len(requests) == summary["submitted"] > 0
        assert set(requests.status) <= {"finished", "failed"}
    edf = pd.read_parquet(tmp_path / "edf" / "requests.parquet")
    late = edf[edf.status == "failed"]
    assert len(late) > 0 and set(late.error) == {"deadline"}  # 40 req/s on rows of 4 outruns a 100 ms TTFT
