"""What vLLM reports about itself, read for the `vllm` backend (worker.vllm_engine): KV pool usage from its
scheduler stats, the pool's geometry, and each request's own engine timestamps."""
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class KVUsage:
    """What the engine's scheduler stats said over the run (filled by `_StatsTap`)."""

    kv_cache_usage: float = 0.0  # fraction of the KV pool in use at the last step
    kv_cache_usage_peak: float = 0.0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_preemptions: int = 0

    def reset(self) -> None:
        """Forget the warm-up."""
        self.kv_cache_usage = self.kv_cache_usage_peak = 0.0
        self.num_preemptions = 0


def stats_tap(usage: KVUsage) -> Callable:
    """A per-engine StatLogger factory that copies scheduler stats into `usage`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _StatsTap(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                usage.kv_cache_usage = scheduler_stats.kv_cache_usage
                usage.kv_cache_usage_peak = max(usage.kv_cache_usage_peak, scheduler_stats.kv_cache_usage)
                usage.num_running_reqs = scheduler_stats.num_running_reqs
                usage.num_waiting_reqs = scheduler_stats.num_waiting_reqs
            if iteration_stats is not None:
                usage.num_preemptions += iteration_stats.num_preempted_reqs

        def log_engine_initialized(self) -> None:
            pass

    return _StatsTap


def kv_geometry(engine) -> dict:
    """Pool facts from the started engine: blocks, block size, bytes per token, pool bytes."""
    vc = engine.vllm_config
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    import torch

    dtype = mc.dtype if cc.cache_dtype == "auto" else getattr(torch, cc.cache_dtype, mc.dtype)
    layers = mc.get_num_layers(pc) * pc.pipeline_parallel_size
    per_token = 2 * layers * mc.get_total_num_kv_heads() * mc.get_head_size() * dtype.itemsize
    blocks, block_size = int(cc.num_gpu_blocks or 0), int(cc.block_size)
    return {"kv_pool_blocks": blocks, "kv_block_size_tokens": block_size, "kv_pool_tokens": blocks * block_size,
            "kv_bytes_per_token": per_token, "kv_pool_bytes": blocks * block_size * per_token,
            "kv_cache_memory_bytes_setting": cc.kv_cache_memory_bytes or 0,
            "dtype": str(mc.dtype).removeprefix("torch.")}


def engine_metrics(ro, offset_s: float) -> dict:
    """vLLM's own per-request timestamps (EngineCore monotonic clock → protocol.clock) and how many
    prompt tokens its prefix cache served."""
    cached = {"cached_tokens": int(ro.num_cached_tokens)} if getattr(ro, "num_cached_tokens", None) is not None else {}
    m = ro.metrics
    if m is None:
        return cached
    return {**cached, "queued_ts": m.queued_ts + offset_s, "scheduled_ts": m.scheduled_ts + offset_s,
            "first_token_ts": m.first_token_ts + offset_s, "last_token_ts": m.last_token_ts + offset_s,
            "first_token_latency_s": m.first_token_latency, "num_preemptions": m.num_preemptions}
