"""Build a worker backend from the run's settings; heavy imports happen only for the chosen one."""
import os

from cli.config import RunConfig, parse_bytes
from worker.backend import BackendError


def worker_mode(cfg: RunConfig) -> str:
    """Continuous strategies need a worker that admits requests at step boundaries."""
    return "continuous" if cfg.strategy in ("continuous", "vllm") else "static"


def worker_rows(cfg: RunConfig) -> int:
    """The most rows a worker runs at once (its hello's max_batch_size): naive's batch size for naive,
    else --max-batch-size. batch_size belongs to naive alone: it must not widen another strategy's cap
    (with the default batch size 8, `--max-batch-size 4` once let a continuous worker run 8 rows)."""
    return cfg.batch_size if cfg.strategy == "naive" else cfg.max_batch_size


def quiet_libraries() -> None:
    """Model libraries log progress bars and INFO lines by default: keep a run's terminal readable
    (the worker's own log still has every warning; set VLLM_LOGGING_LEVEL=INFO to see vLLM's)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def make_backend(cfg: RunConfig):
    """The backend named by cfg.backend, configured for this run's strategy."""
    mode = worker_mode(cfg)
    if cfg.backend in ("hf", "vllm"):
        quiet_libraries()
    if cfg.backend in ("sim", "echo"):
        from worker.sim import SimBackend, make_echo

        backend = (make_echo(mode, worker_rows(cfg)) if cfg.backend == "echo"
                   else SimBackend(cfg.preset, mode, worker_rows(cfg)))
        budget = parse_bytes(cfg.memory_budget)
        if budget:
            backend.info.kv_budget_bytes = budget
        return backend
    if cfg.backend == "hf" and mode == "continuous":
        from worker.hf_continuous import HFContinuousBackend

        return HFContinuousBackend.from_config(cfg, mode)
    if cfg.backend == "hf":
        from worker.hf import HFBackend

        return HFBackend.from_config(cfg, mode)
    if cfg.backend == "vllm":
        from worker.vllm_engine import VLLMBackend

        return VLLMBackend.from_config(cfg, mode)
    if cfg.backend == "openai":
        from worker.openai_client import OpenAIBackend

        return OpenAIBackend.from_config(cfg, mode)
    raise BackendError(f"unknown backend {cfg.backend!r}")
