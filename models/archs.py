"""Real architectures with seeded random weights: `--model mistral-7b-v0.1:random` and friends.

Why random weights suffice (greedy, EOS banned, exact lengths: the cost per step and the KV size are the
real model's) and where the tokenizer and weights come from: docs/workers.md ("Real architectures with
random weights"). Nothing is downloaded: the configs below are the published config.json facts.

This module imports neither torch nor transformers at import time: the simulator's presets
(worker.stepmodel) derive their weight and KV sizes from the same ARCHS, so they cannot disagree.
"""
from dataclasses import dataclass, field

from batchlab.protocol.errors import ConfigError

TINY_MISTRAL = "tiny-mistral"  # the embedded default model (models.folders builds it)
RANDOM_SUFFIX = ":random"
RANDOM_SEED = 0
MISTRAL_TOKENIZER = "Mistral-7B v0.1's SentencePiece (mistral_common tokenizer.model.v1)"


@dataclass(frozen=True, slots=True)
class Arch:
    """One published decoder architecture (Llama/Mistral family: untied embeddings, no biases)."""

    name: str
    original: str  # the hub id whose config.json this copies
    published_params: float  # the parameter count the model card states
    tokenizer_is_original: bool  # False: the original's tokenizer differs from Mistral's used here
    config: dict = field(default_factory=dict)  # config.json keys (model_type included)

    @property
    def head_dim(self) -> int:
        """hidden_size / num_attention_heads."""
        return self.config["hidden_size"] // self.config["num_attention_heads"]


_COMMON = {"vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False, "hidden_act": "silu"}

ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("mistral-7b-v0.1", "mistralai/Mistral-7B-v0.1", 7.24e9, True, {
        **_COMMON, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "sliding_window": 4096, "max_position_embeddings": 32768, "dtype": "bfloat16"}),
    Arch("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", 1.10e9, False, {
        **_COMMON, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
        "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 5632,
        "max_position_embeddings": 2048, "dtype": "bfloat16"}),
    Arch("llama-2-7b", "meta-llama/Llama-2-7b-hf", 6.74e9, False, {
        **_COMMON, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
        "max_position_embeddings": 4096, "dtype": "float16"}),
    # Llama-3.1-8B: GQA (8 KV heads) and a 128256-token vocabulary (its tokenizer is not Mistral's: the :random
    # model reads Mistral's 32000 ids, all below its vocabulary size); rope_scaling as in Meta's config.json
    Arch("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 8.03e9, False, {
        **_COMMON, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "max_position_embeddings": 131072, "dtype": "bfloat16"}),
)}


def random_arch(model: str) -> Arch | None:
    """`NAME:random` → ARCHS[NAME]; None for any other model name; ConfigError for an unknown NAME."""
    if not model.endswith(RANDOM_SUFFIX):
        return None
    name = model.removesuffix(RANDOM_SUFFIX)
    try:
        return ARCHS[name]
    except KeyError:
        choices = ", ".join(f"{n}{RANDOM_SUFFIX}" for n in ARCHS)
        raise ConfigError(f"unknown architecture {name!r} in {model!r} (choose from {choices})") from None


def n_params(arch: Arch) -> int:
    """Exact parameter count: embeddings + LM head + per layer (q, k, v, o, gate/up/down, 2 norms) + final norm."""
    c = arch.config
    hidden, q_width, kv_width = c["hidden_size"], c["num_attention_heads"] * arch.head_dim, \
        c["num_key_value_heads"] * arch.head_dim
    per_layer = hidden * (2 * q_width + 2 * kv_width) + 3 * hidden * c["intermediate_size"] + 2 * hidden
    return 2 * c["vocab_size"] * hidden + c["num_hidden_layers"] * per_layer + hidden


def weights_bytes(arch: Arch, dtype_bytes: int) -> int:
    """Bytes of all weights at `dtype_bytes` per element."""
    return n_params(arch) * dtype_bytes


def kv_token_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV-cache bytes per token: 2 (K and V) × layers × kv_heads × head_dim × bytes per element (the one
    formula: these architectures', an hf worker's (worker.memory.kv_shape) and a vLLM pool's)."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token(arch: Arch, dtype_bytes: int) -> int:
    """kv_token_bytes of `arch`."""
    c = arch.config
    return kv_token_bytes(c["num_hidden_layers"], c["num_key_value_heads"], arch.head_dim, dtype_bytes)


def facts(arch: Arch) -> dict:
    """What a worker's hello (and so the run's summary) says about a `:random` model."""
    vocab = arch.config["vocab_size"]
    same = "same 32000-token vocabulary size" if vocab == 32000 else f"32000 ids within its {vocab}-token vocabulary"
    tokenizer = MISTRAL_TOKENIZER if arch.tokenizer_is_original else f"{MISTRAL_TOKENIZER}, not the original's ({same})"
    return {"weights": "random weights, real architecture", "architecture_of": arch.original,
            "tokenizer": tokenizer}


def hf_config(arch: Arch):
    """The transformers config (MistralConfig / LlamaConfig) of `arch`."""
    from transformers import AutoConfig

    keys = {k: v for k, v in arch.config.items() if k != "model_type"}
    return AutoConfig.for_model(arch.config["model_type"], **keys)


def build_random_model(config, device, dtype, seed: int = RANDOM_SEED):
    """`from_config` straight on `device` in `dtype` (no float32 copy on the host first), seeded, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
