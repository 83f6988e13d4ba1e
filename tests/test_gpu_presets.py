"""worker/gpu_presets.py: the GPU-MODEL-KIND presets, built from a GPU's datasheet, a model's architecture and the
fitted engine terms; their names, kinds and shapes, and the per-kind check a simulated grid makes."""
from pathlib import Path

import pytest
import yaml

from batchlab.lab.simulate import plan_simulation
from batchlab.models.archs import ARCHS, kv_bytes_per_token, weights_bytes
from batchlab.protocol.settings import ConfigError
from batchlab.worker.gpu_presets import (HF_LOOP_STEP_TOKENS, Efficiency, EngineTerms, engine_step_model, gpu_preset,
                                         load_terms, parse_name, preset_kind, preset_names, shipped_terms)
from batchlab.worker.gpus import GPUS, get_gpu
from batchlab.worker.stepmodel import StepModel, get_preset

ROOT = Path(__file__).resolve().parent.parent


def test_every_gpu_model_and_kind_has_a_preset_sized_by_its_architecture():
    names = preset_names()
    assert len(names) == len(GPUS) * 4 * 3 and "rtx3090-mistral-7b-vllm" in names and "h200-llama-3.1-8b-hf" in names
    for name in names:
        model = get_preset(name)
        gpu, short, kind = parse_name(name)
        arch = ARCHS[{"mistral-7b": "mistral-7b-v0.1"}.get(short, short)]
        assert model.weights_bytes == weights_bytes(arch, 2) and model.kv_bytes_per_token == kv_bytes_per_token(arch, 2)
        assert model.memory_bytes == GPUS[gpu].memory_bytes and preset_kind(name) == kind


def test_the_kinds_differ_as_their_workers_do():
    vllm, hf, loop = (get_preset(f"a100-80gb-llama-2-7b-{k}") for k in ("vllm", "hf", "hf-loop"))
    assert (vllm.padded, vllm.fused) == (False, True)  # packed rows, decodes and prefill in one forward
    assert (hf.padded, hf.fused) == (True, False)  # generate(): padded lockstep batches
    assert (loop.padded, loop.fused, loop.step_tokens) == (True, True, HF_LOOP_STEP_TOKENS)
    assert hf.overhead_s > vllm.overhead_s  # eager PyTorch launches every kernel; vLLM replays CUDA graphs


def test_a_faster_gpu_decodes_faster_and_a_small_batch_is_the_weight_stream():
    steps = {g: get_preset(f"{g}-mistral-7b-vllm").decode_step_s(8 * 300, 8) for g in GPUS}
    assert steps["l4"] > steps["rtx3090"] > steps["a100-80gb"] > steps["h100"] > steps["h200"]
    model = get_preset("h100-llama-3.1-8b-vllm")
    weights_s = model.weights_bytes / model.bandwidth_Bps
    assert model.decode_step_s(0, 1) - model.overhead_s == pytest.approx(weights_s, rel=0.05)
    assert model.decode_step_s(0, 4096) > 4096 * model.gemm_s_per_token > weights_s  # past the roofline's knee


def test_a_step_model_is_the_datasheet_and_the_terms_formula():
    gpu, arch = get_gpu("h100"), ARCHS["llama-3.1-8b"]
    terms, eff = EngineTerms("e", 0.002, 1e-5), Efficiency(0.5, 0.5)
    model = StepModel(**engine_step_model("x", gpu, arch, terms, eff))
    assert model.bandwidth_Bps == pytest.approx(0.5 * 3350e9)
    head = 128256 * 4096
    assert model.gemm_s_per_token == pytest.approx(2 * (8_030_261_248 - head) / (0.5 * 989.4e12))
    assert model.decode_s_per_row == pytest.approx(1e-5 + 2 * head / (0.5 * 989.4e12))
    assert model.prefill_s_per_token_pair == pytest.approx(2 * 32 * 4096 / (0.5 * 989.4e12))


def test_names_that_are_not_gpu_presets_are_not_parsed():
    for name in ("3090-mistral-7b", "rtx3090-mistral-7b", "rtx3090-gpt-5-vllm", "tpu-mistral-7b-vllm", "vllm"):
        assert parse_name(name) is None and gpu_preset(name) is None
    with pytest.raises(ValueError, match="GPU-MODEL-KIND"):
        get_preset("rtx3090-gpt-5-vllm")


def test_the_shipped_terms_name_an_engine_for_every_kind_and_a_bad_file_is_one_line(tmp_path):
    terms = shipped_terms()
    assert set(terms.presets) == {"vllm", "hf", "hf-loop"} and set(terms.presets.values()) <= set(terms.engines)
    assert {g.chip for g in GPUS.values()} <= set(terms.efficiency)
    bad = tmp_path / "engines.yaml"
    bad.write_text("engines: {}\n")
    with pytest.raises(ValueError, match="cannot read GPU engine terms") as info:
        load_terms(bad)
    assert "\n" not in str(info.value)


def test_the_fit_writes_every_engine_flag_the_terms_file_reads_back(tmp_path):
    from benchmarks.gpu_fit import _plain

    engine = EngineTerms("e", 0.002, 3e-5, request_overhead_s=0.002, front_end_blocks=True, async_output=True,
                         step_tokens=2048, padded=True, fused=False, prefill_alone=True)
    path = tmp_path / "engines.yaml"
    path.write_text(yaml.safe_dump({"efficiency": {"ga100": {"mem": 0.8, "flop": 0.5}},
                                    "engines": {"e": _plain(engine)}, "presets": {}}))
    assert load_terms(path).engines["e"] == engine
    # the shipped file: only vLLM 0.6.0 delivers late (0.4.1 and V1 hand a step's tokens over at its end)
    assert {k for k, e in shipped_terms().engines.items() if e.async_output} == {"vllm-0.6"}


def test_a_grid_takes_each_kinds_gpu_preset_and_refuses_one_of_another_kind():
    sim = plan_simulation(str(ROOT / "configs" / "gpu.yaml"), {})
    presets = {e.label: e.overrides["preset"] for e in sim.plan.entries}
    assert presets == {"naive": "rtx3090-mistral-7b-hf", "dynamic": "rtx3090-mistral-7b-hf",
                       "continuous": "rtx3090-mistral-7b-hf-loop", "vllm": "rtx3090-mistral-7b-vllm"}
    with pytest.raises(ConfigError, match="rtx3090-mistral-7b-vllm was calibrated on vllm, but strategy continuous"):
        plan_simulation(str(ROOT / "configs" / "gpu.yaml"),
                        {"preset": "hf=rtx3090-mistral-7b-hf,hf-loop=rtx3090-mistral-7b-vllm,"
                                   "vllm=rtx3090-mistral-7b-vllm"})
