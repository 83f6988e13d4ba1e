"""KV-cache arithmetic, the KV budget and peak-memory readings for the Hugging Face backend."""
import resource
import sys
from pathlib import Path

CPU_BUDGET_FRACTION = 0.5  # default CPU KV budget: this share of the RAM available at start
CUDA_RESERVE_MARGIN = 1.25  # measured warm-up activation memory × this, kept out of the KV budget
CUDA_RESERVE_MIN_BYTES = 256 * 2**20  # never keep less than this free (allocator slack, CUDA graphs)


def kv_shape(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder config (Llama, Mistral, GPT-2 style names)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return int(layers), int(kv_heads), int(head_dim)


def batch_kv_bytes(batch_rows: int, max_prompt_len: int, max_output_len: int, per_token_bytes: int) -> int:
    """KV of a padded static batch at its last step: B × (P_max + O_max) × bytes per token."""
    return batch_rows * (max_prompt_len + max_output_len) * per_token_bytes


def cpu_budget_bytes(override_bytes: int = 0) -> int:
    """--memory-budget when given, else CPU_BUDGET_FRACTION of the RAM available now (psutil)."""
    if override_bytes:
        return override_bytes
    import psutil

    return int(CPU_BUDGET_FRACTION * psutil.virtual_memory().available)


def cuda_free_bytes(device) -> int:
    """Free device memory plus what PyTorch's caching allocator holds but does not use."""
    import torch

    free_bytes, _total = torch.cuda.mem_get_info(device)
    return int(free_bytes + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def cuda_reserve_bytes(warmup_peak_bytes: int, before_bytes: int, warmup_kv_bytes: int) -> int:
    """Memory a batch needs beyond its KV (activations, logits, workspace), from the warm-up batch."""
    activations = max(0, warmup_peak_bytes - before_bytes - warmup_kv_bytes)
    return max(CUDA_RESERVE_MIN_BYTES, int(CUDA_RESERVE_MARGIN * activations))


def cpu_peak_rss_bytes() -> int:
    """Peak resident set size of this process since start or the last reset_cpu_peak_rss(): Linux's
    VmHWM, else ru_maxrss (KiB on Linux, bytes on macOS; it cannot be reset)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_cpu_peak_rss() -> None:
    """Start a new peak (a warm worker's next run must not report the last run's peak): writing 5 to
    /proc/self/clear_refs resets VmHWM to the current RSS on Linux; elsewhere nothing can."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
