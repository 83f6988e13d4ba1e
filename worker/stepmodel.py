"""The seed's step-time model: a decode step streams the weights and the live KV cache from memory.

decode_step_s = overhead_s + (weights_bytes + kv_bytes_per_token × context_tokens) / bandwidth_Bps
prefill_s     = overhead_s + weights_bytes / bandwidth_Bps + prefill_s_per_token × prompt_tokens
"""
from dataclasses import asdict, dataclass

from batchlab.worker.archs import ARCHS, kv_bytes_per_token, n_params, weights_bytes

GB = 1e9


@dataclass(frozen=True, slots=True)
class StepModel:
    """Step times of one model on one device (seconds)."""

    name: str
    weights_bytes: float
    kv_bytes_per_token: int
    bandwidth_Bps: float
    prefill_s_per_token: float
    overhead_s: float = 0.0
    memory_bytes: float = 0.0  # device memory, for the KV budget

    def decode_step_s(self, context_tokens: int) -> float:
        """One decode step over `context_tokens` cached tokens (all rows, padding included)."""
        return self.overhead_s + (self.weights_bytes + self.kv_bytes_per_token * context_tokens) / self.bandwidth_Bps

    def prefill_s(self, prompt_tokens: int) -> float:
        """Prefill of `prompt_tokens` tokens in one forward pass (yields the first token)."""
        if prompt_tokens <= 0:
            return 0.0
        return self.overhead_s + self.weights_bytes / self.bandwidth_Bps + self.prefill_s_per_token * prompt_tokens

    def kv_budget_bytes(self) -> int:
        """Device memory left for the KV cache after the weights (10% reserve)."""
        return max(0, int(0.9 * self.memory_bytes - self.weights_bytes))

    def as_dict(self) -> dict:
        """Plain dict (for hello facts and summaries)."""
        return asdict(self)


def _llama_kv(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def _on_gpu(name: str, arch: str, bandwidth_Bps: float, prefill_Fps: float, overhead_s: float,
            memory_bytes: float) -> StepModel:
    """A 16-bit model of worker.archs on a GPU: weights and KV bytes from the architecture (so a preset and
    `--model ARCH:random` agree); prefill ≈ 2·N flops per token at `prefill_Fps` achieved flop/s."""
    a = ARCHS[arch]
    return StepModel(name, float(weights_bytes(a, 2)), kv_bytes_per_token(a, 2), bandwidth_Bps,
                     2 * n_params(a) / prefill_Fps, overhead_s, memory_bytes)


PRESETS: dict[str, StepModel] = {
    # Llama-2-7B FP16 (6.74e9 params) on an A100-40GB: 1.555 TB/s HBM; prefill at ~50% of 312 TFLOP/s.
    "a100-llama2-7b": _on_gpu("a100-llama2-7b", "llama-2-7b", 1555 * GB, 156e12, 0.0005, 40 * GB),
    # Mistral-7B FP16 (7.24e9 params, GQA 8 KV heads) on an RTX 3090: 936 GB/s, 71 TFLOP/s fp16 dense.
    "3090-mistral-7b": _on_gpu("3090-mistral-7b", "mistral-7b-v0.1", 936 * GB, 35e12, 0.0008, 24 * GB),
    # tiny-mistral (56.37M params, fp32) on this 2-core CPU: fitted by benchmarks/step_time.py (15 shapes,
    # B 1-64 × P 33-513, fastest of 7 runs per shape). Mean |relative error| 35% decode, 38% prefill: the
    # box was shared (load ~5), so refit on a quiet machine. Overhead fits to 0 (absorbed in bandwidth).
    "cpu-tiny-mistral": StepModel("cpu-tiny-mistral", 0.2255 * GB, _llama_kv(8, 4, 64, 4), 6.56 * GB,
                                  0.000417, 0.0, 8 * GB),
    # No model at all: the harness alone (the echo backend).
    "echo": StepModel("echo", 0.0, 0, 1.0, 0.0, 0.0, 1e12),
}


def get_preset(name: str) -> StepModel:
    """A preset by name, or ValueError naming the choices."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown sim preset {name!r} (choose from {', '.join(PRESETS)})") from None
