"""The front end's part of a run's settings: a replayed schedule's own traffic settings (every check before
anything starts is the preflight's: runner.preflight)."""
from batchlab.protocol.settings import TRAFFIC_FIELDS, ConfigError, RunConfig
from batchlab.runner.preflight import refuse_schedule_conflicts


def replay_config(cfg: RunConfig, given: dict) -> RunConfig:
    """With --schedule, the traffic settings recorded are the schedule's own; a setting in `given` (the
    command line) that contradicts them is a ConfigError. A schedule saved without its settings yields
    what its rows tell (duration, mean rate); the rest is recorded as unknown (None) unless given, but for
    max_new_tokens: the scheduler's policy runs with the configured cap, so that is what is recorded."""
    from batchlab.traffic.datasets import DatasetError
    from batchlab.traffic.schedule import saved_settings

    try:
        saved, exact = saved_settings(cfg.schedule)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    given = {k: v for k, v in given.items() if k in TRAFFIC_FIELDS and v is not None}
    if exact:
        refuse_schedule_conflicts(given, saved)
    values = {k: v for k, v in {**saved, **({} if exact else given)}.items() if k in TRAFFIC_FIELDS}
    if cfg.concurrency:  # closed loop takes the schedule's requests in order: its own times are not replayed
        values = {k: v for k, v in values.items() if k not in ("rate", "arrival", "burstiness")}
    unknown = {k: None for k in TRAFFIC_FIELDS if k not in values and k != "max_new_tokens"}
    return cfg.model_copy(update={**values, "extra": {**unknown, **cfg.extra}})
