"""A run's schedule from its settings: a saved one (replay) or a new one from the seed."""
from pathlib import Path

from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.schedule import Schedule, build_schedule, load_schedule


def make_schedule(cfg: RunConfig) -> Schedule:
    """The run's schedule: a saved one (replay) or a new one from the seed."""
    if cfg.schedule:
        return load_schedule(Path(cfg.schedule))
    tcfg = TrafficConfig(arrival=cfg.arrival, rate=cfg.rate, duration_s=cfg.duration_s,
                         burstiness=cfg.burstiness, seed=cfg.seed, dataset=cfg.dataset,
                         max_new_tokens=cfg.max_new_tokens, max_prompt_len=cfg.max_prompt_len)
    try:
        tokenizer = tokenizer_for(cfg)
    except (OSError, ValueError) as exc:  # transformers: a path or hub id that holds no tokenizer
        why = " ".join(str(exc).split())
        raise ConfigError(f"--model {cfg.model}: cannot load its tokenizer ({why})") from None
    return build_schedule(tcfg, tokenizer)


def tokenizer_for(cfg: RunConfig):
    """The model's tokenizer (synthetic prompts need none)."""
    if cfg.dataset == "synthetic":
        return None
    from batchlab.worker.tokenizers import get_tokenizer

    return get_tokenizer(cfg.model)
