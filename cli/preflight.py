"""Settings checked before any process starts: the sim preset, a plugin backend, the model (a local
folder, a built-in name, or in the local Hugging Face cache; else the Hub must answer at once). One line each."""
import os
from pathlib import Path

from batchlab.protocol.setting_groups import BACKENDS
from batchlab.protocol.settings import ConfigError, RunConfig

HUB_TIMEOUT_S = 1.5  # one metadata request, never the 50 s of retries a from_pretrained would spend
PATH_PREFIXES = ("/", "./", "../", "~")


def check_before_start(cfg: RunConfig) -> None:
    """ConfigError (one line) for a preset, plugin backend or model that cannot work; nothing starts first."""
    if cfg.backend == "sim":
        check_preset(cfg.preset)
    if cfg.backend not in BACKENDS:  # a plugin: importable, a Backend, running the strategy's mode
        from batchlab.scheduler.strategies import resolve
        from batchlab.worker.factory import backend_class

        backend_class(cfg.backend, resolve(cfg).mode)
    if _uses_model_files(cfg):
        check_model(cfg.model)


def check_preset(name: str) -> None:
    """The sim preset exists and reads as a step model."""
    from batchlab.worker.stepmodel import get_preset

    try:
        get_preset(name)
    except ValueError as exc:
        raise ConfigError(f"--preset: {exc}") from None


def _uses_model_files(cfg: RunConfig) -> bool:
    """A model backend loads the model; traffic tokenizes real prompts with its tokenizer. An openai
    server's model name is the server's business."""
    if cfg.backend == "openai":
        return False
    return cfg.backend in ("hf", "vllm") or cfg.dataset != "synthetic"


def check_model(name: str) -> None:
    """tiny-mistral and NAME:random are built locally; a path must exist; a Hub id must be in the local
    cache, or the Hub must say it exists within HUB_TIMEOUT_S."""
    from batchlab.models.archs import TINY_MISTRAL, random_arch

    if name == TINY_MISTRAL:
        return
    try:
        if random_arch(name) is not None:
            return
    except ValueError as exc:
        raise ConfigError(f"--model: {exc}") from None
    if Path(name).expanduser().exists():
        return
    if name.startswith(PATH_PREFIXES):
        raise ConfigError(f"--model {name}: no such folder")
    _check_hub_model(name)


def _check_hub_model(name: str) -> None:
    try:
        from huggingface_hub import constants, model_info, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    except ImportError:  # no Hub client: the backend's own loader reports what is wrong
        return
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except HFValidationError:
        raise ConfigError(f"--model {name!r} is neither a folder nor a valid Hugging Face model id") from None
    where = f"neither a local folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        raise ConfigError(f"--model {name} is {where}, and the Hub is off (HF_HUB_OFFLINE)")
    try:
        model_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; the download needs a token, which the loader reports
    except RepositoryNotFoundError:
        raise ConfigError(f"--model {name} is {where}, and the Hub has no such model") from None
    except Exception as exc:  # no network, DNS, a timeout: all mean the weights cannot come
        raise ConfigError(f"--model {name} is {where}, and the Hub cannot be reached "
                          f"({type(exc).__name__}); download it first or give a local folder") from None
