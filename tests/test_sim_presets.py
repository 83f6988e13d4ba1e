"""`batchlab simulate` of a grid on several backends: one step-model preset per backend, or a refusal naming it."""
import yaml
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.lab.simulate import parse_presets
from batchlab.worker.stepmodel import get_preset, save_preset
from batchlab.collector.layout import point_dir

runner = CliRunner()
GRID = """base: {backend: hf, model: tiny-mistral, device: cpu, dataset: synthetic, duration_s: 2,
       max_new_tokens: 16, batch_size: 8, max_batch_size: 8}
grid:
  strategies: [dynamic, {strategy: continuous, backend: hf, label: continuous},
               {strategy: vllm, memory_budget: 1GiB, max_num_seqs: 8}]
  rates: [4]
"""
ALL = "hf=cpu-tiny-mistral,hf-loop=a100-llama2-7b,vllm=3090-mistral-7b"


def _simulate(tmp_path, preset: str | None, grid: str = GRID):
    config = tmp_path / "grid.yaml"
    config.write_text(grid)
    extra = ["--preset", preset] if preset is not None else []
    return runner.invoke(app, ["simulate", str(config), *extra, "--out", str(tmp_path / "out")])


def _point_preset(tmp_path, label: str) -> str:
    return yaml.safe_load((tmp_path / "out" / point_dir(label, 4, 0) / "config.yaml").read_text())["preset"]


def test_one_preset_for_a_grid_on_three_backends_is_refused_naming_them(tmp_path):
    result = _simulate(tmp_path, "cpu-tiny-mistral")
    assert result.exit_code == 1
    assert "3 backends (hf, hf-loop, vllm)" in result.output and "Traceback" not in result.output


def test_a_missing_backend_is_refused_naming_it(tmp_path):
    result = _simulate(tmp_path, "hf=cpu-tiny-mistral,hf-loop=a100-llama2-7b")
    assert result.exit_code == 1
    assert "no step-model preset for vllm, which strategy vllm runs on" in result.output
    assert "no step-model preset for hf," in _simulate(tmp_path, None).output


def test_each_entry_plays_its_own_backends_preset(tmp_path):
    result = _simulate(tmp_path, ALL)
    assert result.exit_code == 0, result.output
    assert [_point_preset(tmp_path, e) for e in ("dynamic", "continuous", "vllm")] == [
        "cpu-tiny-mistral", "a100-llama2-7b", "3090-mistral-7b"]


def test_vllm_and_hf_continuous_differ_when_their_presets_do(tmp_path):
    assert _simulate(tmp_path, "hf=cpu-tiny-mistral,hf-loop=a100-llama2-7b,vllm=3090-mistral-7b").exit_code == 0
    out = tmp_path / "out"
    e2e = {label: (out / point_dir(label, 4, 0) / "summary.json").read_text() for label in ("continuous", "vllm")}
    assert e2e["continuous"] != e2e["vllm"]


def test_an_entrys_own_preset_wins_over_the_option(tmp_path):
    grid = GRID.replace("max_num_seqs: 8}", "max_num_seqs: 8, preset: echo}")
    result = _simulate(tmp_path, "hf=cpu-tiny-mistral,hf-loop=a100-llama2-7b", grid)
    assert result.exit_code == 0, result.output
    assert _point_preset(tmp_path, "vllm") == "echo"


def test_a_preset_calibrated_on_another_backend_is_refused(tmp_path):
    path = tmp_path / "vllm.yaml"
    save_preset(get_preset("cpu-tiny-mistral"), path, {"backend": "vllm", "mode": "continuous"})
    result = _simulate(tmp_path, f"hf=cpu-tiny-mistral,hf-loop={path},vllm={path}")
    assert result.exit_code == 1
    assert "calibrated on vllm, but strategy continuous runs on hf-loop" in result.output


def test_preset_grammar():
    assert parse_presets("cpu-tiny-mistral") == ("cpu-tiny-mistral", {})
    assert parse_presets("hf=a.yaml, vllm=b.yaml") == (None, {"hf": "a.yaml", "vllm": "b.yaml"})
    assert parse_presets({"hf-loop": "x"}) == (None, {"hf-loop": "x"})


def test_a_shipped_preset_is_refused_for_a_backend_it_was_not_fitted_to(tmp_path):
    """cpu-tiny-mistral is HF static's (its file's calibration record says so): not the HF loop's."""
    result = _simulate(tmp_path, "hf=cpu-tiny-mistral,hf-loop=cpu-tiny-mistral,vllm=cpu-tiny-mistral-vllm")
    assert result.exit_code == 1
    assert "preset cpu-tiny-mistral was calibrated on hf, but strategy continuous runs on hf-loop" in result.output
    shipped = "hf=cpu-tiny-mistral,hf-loop=cpu-tiny-mistral-loop,vllm=cpu-tiny-mistral-vllm"
    assert _simulate(tmp_path, shipped).exit_code == 0
