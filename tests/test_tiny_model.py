"""tiny-mistral: created once, atomically, loadable like any model, weights fixed by the seed."""
import os

import pytest
import torch

from batchlab.models.folders import MARKER_FILE, build_tiny_model, make_tiny_mistral, resolve_model, tiny_mistral_dir


@pytest.mark.slow  # builds and loads a real model
def test_make_tiny_creates_a_loadable_56m_mistral():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(make_tiny_mistral())
    n_params = sum(p.numel() for p in model.parameters())
    assert type(model).__name__ == "MistralForCausalLM"
    assert 54e6 < n_params < 58e6
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_key_value_heads) == (512, 8, 4)


def test_second_call_reuses_the_folder():
    first = make_tiny_mistral()
    stamp = os.stat(first / "model.safetensors").st_mtime_ns
    assert make_tiny_mistral() == first
    assert os.stat(first / "model.safetensors").st_mtime_ns == stamp


@pytest.mark.slow  # builds and loads a real model
def test_same_seed_same_weights_and_saved_weights_match():
    from transformers import AutoModelForCausalLM

    a, b = build_tiny_model().state_dict(), build_tiny_model().state_dict()
    other = build_tiny_model(seed=1).state_dict()
    saved = AutoModelForCausalLM.from_pretrained(make_tiny_mistral()).state_dict()
    name = "model.layers.3.mlp.up_proj.weight"
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(a[k], saved[k]) for k in a)
    assert not torch.equal(a[name], other[name])


@pytest.mark.slow  # builds and loads a real model
def test_creation_is_atomic_and_force_rebuilds(tmp_path):
    folder = make_tiny_mistral(home=str(tmp_path))
    assert folder == tiny_mistral_dir(str(tmp_path)) and (folder / MARKER_FILE).is_file()
    (folder / "model.safetensors").write_bytes(b"broken")
    assert make_tiny_mistral(home=str(tmp_path), force=True) == folder
    assert (folder / "model.safetensors").stat().st_size > 200e6
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny-mistral"]  # no temp folders left


@pytest.mark.slow  # builds and loads a real model
def test_half_written_folder_is_replaced(tmp_path):
    folder = tiny_mistral_dir(str(tmp_path))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # a killed non-atomic writer would leave this
    assert (make_tiny_mistral(home=str(tmp_path)) / MARKER_FILE).is_file()


def test_resolve_model_maps_only_tiny_mistral():
    assert resolve_model("tiny-mistral") == str(make_tiny_mistral())
    assert resolve_model("TinyLlama/TinyLlama-1.1B-Chat-v1.0") == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert resolve_model("/some/local/path") == "/some/local/path"
