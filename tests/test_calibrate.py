"""Calibration: the fitter recovers known terms and predicts shapes it never saw; settling; preset files."""
import random

import pytest

from batchlab.lab.calibrate import Sample, fit_model, held_out_errors, predict, settle, spread
from batchlab.worker.stepmodel import StepModel, get_preset, load_preset, save_preset

# a CPU with known terms (seconds): what a synthetic "measurement" returns
TRUE = StepModel("true-cpu", 2.2e8, 16384, 0.0, 4e-4, overhead_s=0.006, memory_bytes=8e9, decode_s_per_row=0.002,
                 decode_s_per_context_token=2e-6, prefill_s_per_row=0.003, prefill_s_per_token_pair=1e-7,
                 prefill_overhead_s=0.015, padded=True)
FIT_SHAPES = [(1, 16), (4, 16), (8, 16), (1, 64), (2, 64), (8, 64), (1, 256), (4, 256)]
HELD_BACK = [(2, 16), (4, 64), (2, 256), (8, 256), (16, 128)]


def measured(shapes: list[tuple[int, int]], noise: float = 0.0, seed: int = 0) -> list[Sample]:
    """Prefill and decode samples of TRUE at each shape, with a seeded relative noise."""
    rng, out = random.Random(seed), []
    for rows, p in shapes:
        context = rows * (p + 4.5)
        for kind, seconds in (("prefill", TRUE.prefill_s(rows * p, rows)), ("decode", TRUE.decode_step_s(context, rows))):
            tokens = rows * p if kind == "prefill" else context
            out.append(Sample(kind, rows, p, tokens, seconds * (1 + rng.uniform(-noise, noise))))
    return out


def _fit(samples: list[Sample]) -> StepModel:
    return fit_model(samples, "fitted", form="compute", weights_bytes=TRUE.weights_bytes,
                     kv_bytes_per_token=TRUE.kv_bytes_per_token, memory_bytes=TRUE.memory_bytes, padded=True)


def test_compute_fit_recovers_the_named_terms_exactly():
    model = _fit(measured(FIT_SHAPES))
    for term in ("overhead_s", "decode_s_per_row", "decode_s_per_context_token", "prefill_overhead_s",
                 "prefill_s_per_token", "prefill_s_per_row", "prefill_s_per_token_pair"):
        assert getattr(model, term) == pytest.approx(getattr(TRUE, term), rel=1e-6), term
    assert model.bandwidth_Bps == 0.0 and model.padded


def test_fit_predicts_held_back_shapes_within_the_noise():
    model = _fit(measured(FIT_SHAPES, noise=0.03, seed=1))
    for s in measured(HELD_BACK):
        assert abs(predict(model, s) / s.seconds - 1) < 0.10, (s.kind, s.rows, s.prompt_len)


def test_leave_one_out_errors_are_small_for_a_model_of_the_right_form():
    errs = held_out_errors(measured(FIT_SHAPES), "fitted", form="compute")
    assert max(abs(e) for e in errs) < 1e-3


def test_fit_never_returns_a_negative_term():
    samples = measured(FIT_SHAPES)
    for s in samples:  # a decode cost that falls with context: the true slope is negative, the fit clamps it
        if s.kind == "decode":
            s.seconds = 0.05 - 1e-6 * s.tokens + 0.001 * s.rows
    model = _fit(samples)
    assert model.decode_s_per_context_token == 0.0 and model.overhead_s > 0


def test_memory_form_recovers_the_bandwidth_of_a_memory_bound_device():
    gpu = get_preset("a100-llama2-7b")
    samples = []
    for rows, p in FIT_SHAPES:
        context = rows * (p + 4.5)
        samples += [Sample("prefill", rows, p, rows * p, gpu.prefill_s(rows * p, rows)),
                    Sample("decode", rows, p, context, gpu.decode_step_s(context, rows))]
    model = fit_model(samples, "gpu", form="memory", weights_bytes=gpu.weights_bytes,
                      kv_bytes_per_token=gpu.kv_bytes_per_token)
    assert model.bandwidth_Bps == pytest.approx(gpu.bandwidth_Bps, rel=1e-6)
    assert model.prefill_s_per_token == pytest.approx(gpu.prefill_s_per_token, rel=1e-6)
    assert model.overhead_s == pytest.approx(gpu.overhead_s, rel=1e-6)


def test_settle_stops_once_the_spread_is_within_tolerance():
    values = iter([1.0, 1.01, 0.99, 5.0, 5.0])
    result = settle(lambda: {"decode": next(values)}, min_rounds=3, max_rounds=5)["decode"]
    assert (result.rounds, result.settled, result.value) == (3, True, 1.0)


def test_settle_says_when_the_machine_was_too_noisy():
    values = iter([1.0, 2.0, 3.0, 1.5, 2.5, 1.2])
    result = settle(lambda: {"decode": next(values)}, min_rounds=3, max_rounds=6)["decode"]
    assert result.rounds == 6 and not result.settled and result.spread == pytest.approx(spread([1.0, 2.0, 3.0, 1.5, 2.5, 1.2]))


def test_a_preset_file_loads_wherever_a_preset_name_does(tmp_path):
    path = tmp_path / "cpu.yaml"
    save_preset(TRUE, path, {"backend": "hf", "shapes": []})
    assert get_preset(str(path)) == TRUE == load_preset(path)


def test_an_unreadable_preset_file_is_one_value_error(tmp_path):
    with pytest.raises(ValueError, match="unknown sim preset"):
        get_preset("no-such-preset")
    with pytest.raises(ValueError, match="cannot read"):
        get_preset(str(tmp_path / "missing.yaml"))
    (tmp_path / "bad.yaml").write_text("name: x\nbogus: 1\n")
    with pytest.raises(ValueError, match="not a step model"):
        get_preset(str(tmp_path / "bad.yaml"))


@pytest.mark.slow
def test_calibrate_quick_on_tiny_mistral_writes_a_loadable_preset(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    out = tmp_path / "tiny.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--backend", "hf", "--model", "tiny-mistral", "--device", "cpu",
                                      "--quick", "--batch-sizes", "1,2", "--prompt-lens", "8,16", "--out", str(out)])  # the fewest
    assert result.exit_code == 0, result.output
    model = get_preset(str(out))
    assert model.name == "tiny" and model.padded and model.bandwidth_Bps == 0.0
    assert model.decode_step_s(32, 2) > 0 and model.prefill_s(32, 2) > 0
    assert "held out error" in result.output
    import yaml

    shapes = yaml.safe_load(out.read_text())["calibration"]["shapes"]
    assert {(r["kind"], r["rows"], r["prompt_len"]) for r in shapes} == {
        (k, b, p) for k in ("prefill", "decode") for b in (1, 2) for p in (8, 16)}
    for row in shapes:  # each measured shape predicted by a fit that never saw it, and by the written model
        assert row["held_out_error"] is not None and row["measured_ms"] > 0
        assert row["model_ms"] / row["measured_ms"] - 1 == pytest.approx(row["fit_error"], abs=2e-3)
