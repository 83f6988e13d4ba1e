"""Build a worker backend from the run's settings; heavy imports happen only for the chosen one.

The worker never reads the strategy: the front end resolves it (scheduler.strategies.resolve) and
passes the mode it needs (static or continuous) and the most rows it runs at once.
"""
import os

from batchlab.protocol.settings import RunConfig, parse_bytes
from batchlab.worker.backend import BackendError


def quiet_libraries() -> None:
    """Model libraries log progress bars and INFO lines by default: keep a run's terminal readable
    (the worker's own log still has every warning; set VLLM_LOGGING_LEVEL=INFO to see vLLM's)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def make_backend(cfg: RunConfig, mode: str, rows: int):
    """The backend named by cfg.backend in `mode` (static | continuous), running at most `rows` rows."""
    if cfg.backend in ("hf", "vllm"):
        quiet_libraries()
    if cfg.backend in ("sim", "echo"):
        from batchlab.worker.sim import SimBackend, make_echo

        backend = (make_echo(mode, rows) if cfg.backend == "echo"
                   else SimBackend(cfg.preset, mode, rows, step_tokens=cfg.max_num_batched_tokens))
        budget = parse_bytes(cfg.memory_budget)
        if budget:
            backend.info.kv_budget_bytes = budget
        return backend
    if cfg.backend == "hf" and mode == "continuous":
        from batchlab.worker.hf.continuous import HFContinuousBackend

        return HFContinuousBackend.from_config(cfg, mode, rows)
    if cfg.backend == "hf":
        from batchlab.worker.hf.static import HFBackend

        return HFBackend.from_config(cfg, mode, rows)
    if cfg.backend == "vllm":
        from batchlab.worker.vllm_engine import VLLMBackend

        return VLLMBackend.from_config(cfg, mode, rows)
    if cfg.backend == "openai":
        from batchlab.worker.openai_client import OpenAIBackend

        return OpenAIBackend.from_config(cfg, mode, rows)
    raise BackendError(f"unknown backend {cfg.backend!r}")
