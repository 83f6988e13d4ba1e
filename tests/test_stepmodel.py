"""The step model's compute-bound terms, and how the simulator's cores count padding."""
import numpy as np
import pytest

from batchlab.worker.backend import BackendRequest
from batchlab.worker.sim import ContinuousCore, static_step_durations
from batchlab.worker.stepmodel import PRESETS, StepModel

CPU = StepModel("cpu", 0.0, 0, 0.0, 1e-3, overhead_s=0.01, decode_s_per_row=0.002,
                decode_s_per_context_token=1e-5, prefill_s_per_row=0.004, prefill_s_per_token_pair=1e-6,
                prefill_overhead_s=0.02)


def test_compute_terms_add_up_per_rows_tokens_and_pairs():
    assert CPU.decode_step_s(100, 4) == pytest.approx(0.01 + 4 * 0.002 + 100 * 1e-5)
    assert CPU.prefill_s(60, 2, 10**2 + 50**2) == pytest.approx(0.02 + 60e-3 + 2 * 0.004 + 2600e-6)
    assert CPU.prefill_s(60, 2) == pytest.approx(0.02 + 60e-3 + 2 * 0.004 + 1800e-6)  # equal rows: 2 × 30²


def test_the_seed_presets_keep_their_memory_bound_times():
    gpu = PRESETS["a100-llama2-7b"]
    assert gpu.decode_step_s(1000, 8) == pytest.approx(gpu.overhead_s + (gpu.weights_bytes + gpu.kv_bytes_per_token * 1000)
                                                      / gpu.bandwidth_Bps)


def test_a_static_batch_pays_for_every_row_padded_to_the_longest_prompt():
    rows = [BackendRequest.new(0, 10, 3, [], 0), BackendRequest.new(1, 30, 2, [], 0)]
    assert static_step_durations(rows, CPU) == pytest.approx(
        [CPU.prefill_s(60, 2), CPU.decode_step_s(2 * 31, 2), CPU.decode_step_s(2 * 32, 2)])


@pytest.mark.parametrize("padded", [False, True])
def test_continuous_joiners_are_packed_or_padded_as_the_worker_does(padded):
    model = StepModel(**{**CPU.as_dict(), "padded": padded})
    core = ContinuousCore(model)
    core.admit(1, 10, 3)
    core.admit(2, 30, 3)
    first = core.plan_step()
    prefill = model.prefill_s(60, 2) if padded else model.prefill_s(40, 2, 10**2 + 30**2)
    assert first.duration_s == pytest.approx(prefill)
    second = core.plan_step()
    context = 2 * (30 + 1) if padded else (10 + 1) + (30 + 1)  # padded: rows × the widest row
    assert second.duration_s == pytest.approx(model.decode_step_s(context, 2))


@pytest.mark.parametrize("fused", [False, True])
def test_a_fused_continuous_step_pays_its_fixed_cost_once(fused):
    model = StepModel(**{**CPU.as_dict(), "fused": fused})
    core = ContinuousCore(model)
    core.admit(1, 10, 3)
    alone = core.plan_step()  # only a prefill: nothing to share
    assert alone.duration_s == pytest.approx(model.prefill_s(10, 1, 100))
    core.admit(2, 30, 3)
    both = core.plan_step()
    decode, prefill = model.decode_step_s(11, 1), model.prefill_s(30, 1, 900)
    assert both.duration_s == pytest.approx(decode + prefill - (min(0.01, 0.02) if fused else 0.0))
    gpu = StepModel(**{**PRESETS["a100-llama2-7b"].as_dict(), "fused": True})  # the weight stream, read once
    assert gpu.fused_s(1.0, 2.0) == pytest.approx(3.0 - gpu.overhead_s - gpu.weights_bytes / gpu.bandwidth_Bps)


# a GPU-like roofline: the weights stream in 10 ms, their GEMMs cost 1 ms a token; 1 ms of fixed cost a step
ROOFLINE = StepModel("roofline", 1e10, 1000, 1e12, 0.0, 0.001, 80e9, gemm_s_per_token=0.001, fused=True)


def test_a_gemm_term_makes_a_step_the_larger_of_weight_stream_and_compute():
    assert ROOFLINE.decode_step_s(0, 4) == pytest.approx(0.001 + 0.010)  # 4 rows: streaming the weights dominates
    assert ROOFLINE.decode_step_s(0, 16) == pytest.approx(0.001 + 0.016)  # 16 rows: their arithmetic does
    assert ROOFLINE.decode_step_s(2000, 4) == pytest.approx(0.001 + 0.010 + 2000 * 1000 / 1e12)  # KV adds on
    assert ROOFLINE.prefill_s(30, 1) == pytest.approx(0.001 + 0.030)
    no_gemm = StepModel("plain", 1e10, 1000, 1e12, 0.0, 0.001, 80e9)
    assert no_gemm.decode_step_s(0, 16) == pytest.approx(0.011)  # without the term: the weight stream alone


def test_a_fused_step_with_a_gemm_term_is_one_forward_over_all_its_tokens():
    decode, prefill = ROOFLINE.decode_step_s(0, 4), ROOFLINE.prefill_s(20, 1)  # 0.011 and 0.021
    assert ROOFLINE.fused_s(decode, prefill, 4, 20) == pytest.approx(0.001 + max(0.010, 0.024))
    assert ROOFLINE.fused_s(ROOFLINE.decode_step_s(0, 2), ROOFLINE.prefill_s(5, 1), 2, 5) == pytest.approx(0.011)
    core = ContinuousCore(ROOFLINE)
    core.admit(1, 8, 4)
    core.plan_step()
    core.admit(2, 20, 4)
    assert core.plan_step().duration_s == pytest.approx(0.001 + max(0.010, 0.021) + 9 * 1000 / 1e12)


def test_a_scaled_model_takes_every_step_that_many_times_longer():
    for model in (CPU, PRESETS["a100-llama2-7b"], ROOFLINE):
        slow = model.scaled(1.25)
        assert slow.decode_step_s(300, 4) == pytest.approx(1.25 * model.decode_step_s(300, 4))
        assert slow.prefill_s(60, 2, 2600) == pytest.approx(1.25 * model.prefill_s(60, 2, 2600))
    assert CPU.scaled(1.0) is CPU


# vLLM on the 2-core CPU: 1 and 2 rows slower than the terms say, 4 faster (row_factor)
SHAPED = StepModel(**{**CPU.as_dict(), "decode_rows_factor": (1.4, 1.5, 1.0, 0.9)})


def test_a_decode_step_alone_takes_its_row_counts_factor_and_the_decodes_beside_a_prompt_do_not():
    for rows, factor in ((1, 1.4), (2, 1.5), (3, 1.0), (4, 0.9), (5, 1.0), (8, 1.0)):
        assert SHAPED.decode_step_s(100, rows) == pytest.approx(factor * CPU.decode_step_s(100, rows)), rows
        assert SHAPED.decode_step_s(100, rows, alone=False) == pytest.approx(CPU.decode_step_s(100, rows)), rows
    assert SHAPED.scaled(2.0).decode_step_s(100, 2) == pytest.approx(2.0 * SHAPED.decode_step_s(100, 2))
    rows = [BackendRequest.new(0, 10, 3, [], 0)]  # a static batch's decode steps are decode steps alone
    assert static_step_durations(rows, SHAPED)[1:] == pytest.approx([1.4 * CPU.decode_step_s(11, 1),
                                                                     1.4 * CPU.decode_step_s(12, 1)])
    core = ContinuousCore(SHAPED)
    core.admit(1, 10, 4)
    assert core.plan_step().duration_s == pytest.approx(CPU.prefill_s(10, 1, 100))
    assert core.plan_step().duration_s == pytest.approx(1.4 * CPU.decode_step_s(11, 1))  # alone
    core.admit(2, 30, 3)
    mixed = core.plan_step()  # row 1's decode beside row 2's prompt: the terms' decode
    assert mixed.duration_s == pytest.approx(CPU.decode_step_s(12, 1) + CPU.prefill_s(30, 1, 900))
    assert core.plan_step().duration_s == pytest.approx(1.5 * CPU.decode_step_s(13 + 31, 2))


def test_a_preset_file_keeps_its_row_factors(tmp_path):
    from batchlab.worker.stepmodel import load_preset, save_preset

    save_preset(SHAPED, tmp_path / "shaped.yaml")
    back = load_preset(tmp_path / "shaped.yaml")
    assert back == SHAPED and back.decode_rows_factor == (1.4, 1.5, 1.0, 0.9)
    assert hash(back) == hash(SHAPED)  # a file's list is held as a tuple


def test_the_run_speed_factor_is_seeded_by_the_run_and_differs_between_labels():
    from batchlab.worker.stepmodel import speed_factor

    assert speed_factor(0.0, 3, 1, "naive") == 1.0
    assert speed_factor(0.1, 3, 1, "naive") == speed_factor(0.1, 3, 1, "naive")  # the same run, the same factor
    factors = [speed_factor(0.1, seed, 0, label) for seed in range(400) for label in ("a", "b")]
    assert len(set(factors)) == len(factors)  # twins at one repeat differ, and so do seeds
    logs = np.log(factors)
    assert abs(logs.mean()) < 0.02 and 0.09 < logs.std() < 0.11  # lognormal, σ as asked


def test_speed_noise_reaches_the_live_sim_worker_and_the_simulator_alike():
    from batchlab.runner.preflight import checked_config
    from batchlab.runner.pool import worker_key
    from batchlab.scheduler.strategies import resolve
    from batchlab.simulator.run import sim_worker
    from batchlab.worker.sim import SimBackend, run_speed

    cfg = checked_config({"backend": "sim", "strategy": "naive", "speed_noise": 0.2, "seed": 4, "repeat": 1,
                          "label": "twin", "out": "."}, {})
    live, simulated = SimBackend.from_config(cfg, "static", 8), sim_worker(cfg, resolve(cfg)).model
    assert run_speed(cfg) != 1.0 and live.info.facts["speed_factor"] == run_speed(cfg)
    assert live.model.decode_step_s(100, 8) == pytest.approx(simulated.decode_step_s(100, 8))
    assert live.model.decode_step_s(100, 8) == pytest.approx(run_speed(cfg) * PRESETS[cfg.preset].decode_step_s(100, 8))
    other = cfg.model_copy(update={"label": "naive"})
    assert worker_key(cfg) != worker_key(other)  # a warm worker would carry one run's speed into the next
    quiet = [c.model_copy(update={"speed_noise": 0.0}) for c in (cfg, other)]
    assert worker_key(quiet[0]) == worker_key(quiet[1])


def test_a_preset_file_is_parsed_once_and_read_again_when_its_text_changes(tmp_path, monkeypatch):
    import yaml

    from batchlab.worker.stepmodel import load_preset, save_preset

    parsed = []
    real = yaml.safe_load
    monkeypatch.setattr(yaml, "safe_load", lambda text: parsed.append(1) or real(text))
    path = tmp_path / "fitted.yaml"
    save_preset(PRESETS["a100-llama2-7b"], path, {"written_to": str(path)})  # a text no other test parsed
    first = [load_preset(path) for _ in range(5)]
    save_preset(PRESETS["a100-llama2-7b"].scaled(2.0), path, {"written_to": str(path)})
    again = load_preset(path)
    assert len(parsed) == 2
    assert first[0] == first[-1] and first[0].name == PRESETS["a100-llama2-7b"].name
    assert again.overhead_s == pytest.approx(2.0 * first[0].overhead_s)


def test_a_saturated_run_and_a_capacity_probe_share_their_warm_worker():
    from batchlab.runner.preflight import checked_config
    from batchlab.runner.pool import worker_key

    base = {"backend": "sim", "strategy": "dynamic", "out": "."}
    saturated = checked_config({**base, "rate": float("inf"), "concurrency": 16, "num_requests": 400,
                                "max_queue": 0, "duration_s": 2}, {})
    probe = checked_config({**base, "rate": 12.5, "max_queue": 32, "duration_s": 4}, {})
    assert worker_key(saturated) == worker_key(probe)  # the traffic's pool of prompts is no worker setting
    assert worker_key(probe) != worker_key(probe.model_copy(update={"max_batch_size": 4}))
