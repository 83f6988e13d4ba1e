"""The front end's part of a run's settings: a replayed schedule's own traffic settings, and the one
check of a whole config (its strategy resolved) before anything starts."""
from dataclasses import replace

from batchlab.protocol.settings import TRAFFIC_FIELDS, ConfigError, RunConfig, build_config


def checked_config(file_values: dict, overrides: dict) -> RunConfig:
    """build_config, then the strategy resolved (an unknown name or a bad parameter is a ConfigError);
    its strategy_args are kept typed (--strategy-arg gives text)."""
    from batchlab.scheduler.strategies import resolve

    cfg = build_config(file_values, overrides)
    cfg.strategy_args = resolve(cfg).args
    for name in ("prompt_lengths", "output_lengths"):  # one text form, whatever the YAML held
        setattr(cfg, name, _lengths_text(name, getattr(cfg, name)))
    return cfg


def _lengths_text(name: str, value: object) -> str:
    """A length setting (int, list, mapping or text) as the text traffic.lengths reads back; "" stays "";
    ConfigError naming the setting when it describes no lengths."""
    from batchlab.traffic.lengths import LengthSpec, parse_lengths

    if value in (None, ""):
        return ""
    try:
        return parse_lengths(value, LengthSpec(), name).text()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


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
        _refuse_conflicts(given, saved)
    values = {k: v for k, v in {**saved, **({} if exact else given)}.items() if k in TRAFFIC_FIELDS}
    unknown = {k: None for k in TRAFFIC_FIELDS if k not in values and k != "max_new_tokens"}
    return replace(cfg, **values, extra={**unknown, **cfg.extra})


def _refuse_conflicts(given: dict, saved: dict) -> None:
    """ConfigError for the first option given whose value differs from the schedule's."""
    for name, value in given.items():
        if name in ("prompt_lengths", "output_lengths"):
            value = _lengths_text(name, value)
        if value != saved.get(name):
            option = "--duration" if name == "duration_s" else "--" + name.replace("_", "-")
            raise ConfigError(f"{option} {_show(value)} conflicts with the replayed schedule "
                              f"({name} {_show(saved.get(name))}); drop it or build a new schedule")


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
