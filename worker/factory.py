"""Build a worker backend from the run's settings; heavy imports happen only for the chosen one.

`--backend` names a backend as `--strategy` names a strategy (protocol/plugins.py): a built-in (sim,
echo, hf, vllm, openai), the name of a `batchlab.backends` entry point, or `package.module:Class`. A
backend is a worker.backend.Backend subclass, built by `Class.from_config(cfg, mode, rows)`.

The worker never reads the strategy: the front end resolves it (scheduler.strategies.resolve) and
passes the mode it needs (static or continuous) and the most rows it runs at once.
"""
import os
import sys

from batchlab.protocol.plugins import BACKEND_GROUP, Registry
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.worker.backend import Backend
from batchlab.worker.threads import place_worker

BUILTINS = {"sim": "batchlab.worker.sim:SimBackend", "echo": "batchlab.worker.sim:EchoBackend",
            "hf": "batchlab.worker.hf.static:HFBackend", "vllm": "batchlab.worker.vllm_engine:VLLMBackend",
            "openai": "batchlab.worker.openai_client:OpenAIBackend"}
HF_LOOP = "batchlab.worker.hf.continuous:HFContinuousBackend"  # `hf` in continuous mode
REGISTRY = Registry("backend", BACKEND_GROUP, BUILTINS, ConfigError)


def quiet_libraries() -> None:
    """Model libraries log progress bars and INFO lines by default: keep a run's terminal readable
    (the worker's own log still has every warning; set VLLM_LOGGING_LEVEL=INFO to see vLLM's)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def backend_class(spec: str, mode: str) -> type[Backend]:
    """The Backend subclass `spec` names, able to run `mode`; ConfigError (one line) when it is not."""
    cls = REGISTRY.load(spec)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"backend {spec} is not a backend class: derive it from batchlab.worker.backend.Backend")
    if mode not in cls.modes:
        raise ConfigError(f"backend {spec} runs {' or '.join(cls.modes)} batches, and the strategy needs {mode}")
    return cls


def make_backend(cfg: RunConfig, mode: str, rows: int) -> Backend:
    """The backend named by cfg.backend in `mode` (static | continuous), running at most `rows` rows."""
    if cfg.backend in ("hf", "vllm"):
        quiet_libraries()
    spec = HF_LOOP if cfg.backend == "hf" and mode == BatchingMode.CONTINUOUS else cfg.backend
    return backend_class(spec, mode).from_config(cfg, mode, rows)


def make_placed_backend(cfg: RunConfig, mode: str, rows: int) -> Backend:
    """In a worker's own process: its threads placed by the run's policy first (worker.threads: before torch
    starts its OpenMP runtime), then make_backend, the policy recorded in the worker's facts."""
    threads = place_worker(cfg)
    backend = make_backend(cfg, mode, rows)
    if threads is not None:
        torch = sys.modules.get("torch")  # what the model's operators really run on, read back
        backend.info.facts.update(threads.facts(), torch_threads=torch.get_num_threads() if torch else None)
    return backend
