"""Real architectures with random weights (models.archs): shapes, sizes, folders and tokenizer, no network."""
from pathlib import Path

import pytest
import torch

from batchlab.models.archs import (ARCHS, build_random_model, facts, hf_config, kv_bytes_per_token, kv_token_bytes,
                                   n_params, random_arch, weights_bytes)
from batchlab.models.folders import make_random_dir
from batchlab.worker.memory import kv_shape
from batchlab.worker.stepmodel import PRESETS
from batchlab.models.tokenizers import (SentencePieceTokenizer, get_tokenizer, hf_tokenizer_from_sentencepiece,
                                        mistral_tokenizer_file)

PUBLISHED_PARAMS = {"mistral-7b-v0.1": 7.24e9, "tinyllama-1.1b": 1.10e9, "llama-2-7b": 6.74e9, "llama-3.1-8b": 8.03e9}
# 2 × layers × kv_heads × head_dim at 2 bytes (bf16/fp16)
KV_BYTES_16BIT = {"mistral-7b-v0.1": 2 * 32 * 8 * 128 * 2, "tinyllama-1.1b": 2 * 22 * 4 * 64 * 2,
                  "llama-2-7b": 2 * 32 * 32 * 128 * 2, "llama-3.1-8b": 2 * 32 * 8 * 128 * 2}
TEXTS = ["Hello world", "  two leading spaces", "Batching <s> tokens: 42 × 3 = 126!\n\tdone", "日本語のテキスト"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_architecture_builds_on_meta_with_the_published_parameter_count(name):
    model = build_random_model(hf_config(ARCHS[name]), "meta", torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert all(p.device.type == "meta" and p.dtype == torch.bfloat16 for p in model.parameters())
    assert abs(count - PUBLISHED_PARAMS[name]) / PUBLISHED_PARAMS[name] < 0.01
    assert count == n_params(ARCHS[name])  # the torch-free count the sim presets use


@pytest.mark.parametrize("name", sorted(KV_BYTES_16BIT))
def test_kv_bytes_per_token_is_two_layers_kv_heads_head_dim_dtype_bytes(name):
    arch = ARCHS[name]
    assert kv_bytes_per_token(arch, 2) == KV_BYTES_16BIT[name]
    assert kv_bytes_per_token(arch, 4) == 2 * KV_BYTES_16BIT[name]
    assert kv_token_bytes(*kv_shape(hf_config(arch)), 2) == KV_BYTES_16BIT[name]  # what an hf worker reports at hello


def test_sim_presets_take_weight_and_kv_sizes_from_the_architectures():
    for preset, name in (("a100-llama2-7b", "llama-2-7b"), ("3090-mistral-7b", "mistral-7b-v0.1")):
        assert PRESETS[preset].weights_bytes == weights_bytes(ARCHS[name], 2)
        assert PRESETS[preset].kv_bytes_per_token == kv_bytes_per_token(ARCHS[name], 2)


def test_mistral_keeps_its_published_window_theta_and_positions():
    config = hf_config(ARCHS["mistral-7b-v0.1"])
    assert (config.sliding_window, config.max_position_embeddings, config.rms_norm_eps) == (4096, 32768, 1e-5)
    assert config.rope_parameters["rope_theta"] == 10000.0 and config.vocab_size == 32000


def test_random_folder_holds_config_and_tiny_mistrals_tokenizer_but_no_weights(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    folder = make_random_dir(ARCHS["tinyllama-1.1b"], home=str(tmp_path))
    assert not [p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    config = AutoConfig.from_pretrained(folder)
    assert (type(config).__name__, config.num_hidden_layers, config.num_key_value_heads) == ("LlamaConfig", 22, 4)
    reference = tmp_path / "reference"
    hf_tokenizer_from_sentencepiece(mistral_tokenizer_file()).save_pretrained(reference)
    assert (folder / "tokenizer.json").read_text() == (reference / "tokenizer.json").read_text()
    sentencepiece = SentencePieceTokenizer(mistral_tokenizer_file())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert [tokenizer.encode(t, add_special_tokens=False) for t in TEXTS] == [sentencepiece.encode(t) for t in TEXTS]


def test_traffic_tokenizes_a_random_model_like_tiny_mistral():
    random_tok, tiny_tok = get_tokenizer("mistral-7b-v0.1:random"), get_tokenizer("tiny-mistral")
    assert isinstance(random_tok, SentencePieceTokenizer) and random_tok.vocab_size == 32000
    assert [random_tok.encode(t) for t in TEXTS] == [tiny_tok.encode(t) for t in TEXTS]


def test_unknown_random_architecture_is_refused_with_the_choices():
    assert random_arch("tiny-mistral") is None and random_arch("mistralai/Mistral-7B-v0.1") is None
    with pytest.raises(ValueError, match="mistral-7b-v0.1:random"):
        random_arch("gpt-5:random")


def test_llama_31_keeps_its_vocabulary_theta_and_rope_scaling():
    config = hf_config(ARCHS["llama-3.1-8b"])
    assert (config.vocab_size, config.num_key_value_heads, config.intermediate_size) == (128256, 8, 14336)
    assert config.rope_parameters["rope_theta"] == 500000.0 and config.rope_parameters["rope_type"] == "llama3"
    assert "32000 ids within its 128256-token vocabulary" in facts(ARCHS["llama-3.1-8b"])["tokenizer"]


def test_facts_say_random_weights_and_whose_tokenizer():
    assert facts(ARCHS["mistral-7b-v0.1"])["weights"] == "random weights, real architecture"
    assert "not the original's" not in facts(ARCHS["mistral-7b-v0.1"])["tokenizer"]
    for name in ("tinyllama-1.1b", "llama-2-7b"):
        assert "Mistral-7B v0.1" in facts(ARCHS[name])["tokenizer"] and "not the original's" in facts(ARCHS[name])["tokenizer"]


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_loads_a_random_model_with_its_dummy_format(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from batchlab.worker.vllm_engine import VLLMSettings, _engine_args

    monkeypatch.setenv("BATCHLAB_HOME", str(tmp_path))
    args = _engine_args(VLLMSettings(model="tinyllama-1.1b:random"), on_cpu=True)
    assert args.load_format == "dummy" and args.model == str(tmp_path / "models" / "tinyllama-1.1b-random")
    assert _engine_args(VLLMSettings(model="mistralai/Mistral-7B-v0.1"), on_cpu=True).load_format == "auto"


def test_serve_command_starts_a_vllm_server_on_the_random_folder_with_dummy_weights():
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    result = CliRunner().invoke(app, ["model", "serve-command", "tinyllama-1.1b:random", "--port", "8123"])
    assert result.exit_code == 0
    words = result.stdout.split()
    folder = Path(words[words.index("--model") + 1])
    assert (folder / "config.json").exists() and not list(folder.glob("*.safetensors"))
    assert words[words.index("--load-format") + 1] == "dummy" and "8123" in words
    bad = CliRunner().invoke(app, ["model", "serve-command", "gpt-5:random"])
    assert bad.exit_code == 1 and "unknown architecture" in bad.output
