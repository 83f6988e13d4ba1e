"""A run's schedule from its settings: a saved one (replay) or a new one from the seed."""
import math
from pathlib import Path

from batchlab.models.tokenizers import get_tokenizer
from batchlab.protocol.settings import TRAFFIC_FIELDS, ConfigError, RunConfig, said
from batchlab.traffic.config import TrafficConfig, default_output_lengths
from batchlab.traffic.lengths import LengthSpec, parse_lengths
from batchlab.traffic.schedule import Schedule, build_schedule, load_schedule

# A closed loop stopped by --duration alone takes at most this many requests (the seeded schedule's first
# ones): the clients' send times are not known before the run; the run ends early if they run out.
CLOSED_LOOP_POOL_REQUESTS = 10_000


def make_schedule(cfg: RunConfig) -> Schedule:
    """The run's schedule: a saved one (replay) or a new one from the seed."""
    if cfg.schedule:
        return load_schedule(Path(cfg.schedule))
    tcfg = traffic_config(cfg)
    try:  # synthetic prompts need no tokenizer
        tokenizer = None if cfg.dataset == "synthetic" else get_tokenizer(cfg.model)
    except (OSError, ValueError) as exc:  # transformers: a path or hub id that holds no tokenizer
        why = " ".join(str(exc).split())
        raise ConfigError(f"{said('model')} {cfg.model}: cannot load its tokenizer ({why})") from None
    try:
        return build_schedule(tcfg, tokenizer)
    except ValueError as exc:  # the traffic's own rules (a trace's window, the prompt source): the settings'
        raise ConfigError(str(exc)) from None


def traffic_config(cfg: RunConfig) -> TrafficConfig:
    """The TrafficConfig of a run's settings; ConfigError for unreadable synthetic lengths."""
    try:
        prompt_lengths = parse_lengths(getattr(cfg, "prompt_lengths", None), LengthSpec(), "prompt_lengths")
        output_lengths = parse_lengths(getattr(cfg, "output_lengths", None), default_output_lengths(),
                                       "output_lengths")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    closed = int(getattr(cfg, "concurrency", 0) or 0) > 0
    count = int(getattr(cfg, "num_requests", 0) or 0)
    if closed and not count:  # stopped by --duration alone: a pool of requests for the clients to take
        count = CLOSED_LOOP_POOL_REQUESTS
    given = {name: getattr(cfg, name) for name in TRAFFIC_FIELDS if hasattr(cfg, name)}  # older records lack some
    return TrafficConfig(**{**given, "rate": math.inf if closed else cfg.rate, "num_requests": count,
                            "prompt_lengths": prompt_lengths, "output_lengths": output_lengths})
