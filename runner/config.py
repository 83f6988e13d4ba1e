"""The front end's part of a run's settings: a replayed schedule's own traffic settings, and the one
check of a whole config (its strategy resolved) before anything starts."""
from batchlab.protocol.settings import TRAFFIC_FIELDS, ConfigError, RunConfig, build_config, said


def checked_config(file_values: dict, overrides: dict) -> RunConfig:
    """build_config, then the strategy resolved and its decide called once on an empty queue (an unknown name,
    a bad parameter or a decide that raises is a ConfigError);
    its strategy_args are kept typed (--strategy-arg gives text)."""
    from batchlab.scheduler.strategies import check_decides, resolve

    cfg = build_config(file_values, overrides)
    strategy = resolve(cfg)
    check_decides(strategy)  # a class without decide, or one that raises on its first look: before any process
    cfg.strategy_args = strategy.args
    for name in ("prompt_lengths", "output_lengths"):  # one text form, whatever the YAML held
        setattr(cfg, name, _lengths_text(name, getattr(cfg, name)))
    _check_frame(strategy.rows if strategy.mode == "static" else 1, cfg.max_prompt_len)
    if 0 < cfg.concurrency < strategy.rows and strategy.name == "naive":  # its batches would never fill
        raise ConfigError(f"naive launches exactly {strategy.rows} requests at once, and {cfg.concurrency} "
                          f"closed-loop clients never have that many out: use {said('batch_size')} ≤ "
                          f"{said('concurrency')}")
    _check_trace(cfg.dataset)
    return cfg


def _check_frame(rows: int, max_prompt_len: int) -> None:
    """ConfigError when one batch's Dispatch could pass the frame limit: a static batch is one message
    of `rows` prompts of up to max_prompt_len token ids (4 bytes each); a continuous one, one request."""
    from batchlab.protocol.codec import MAX_MESSAGE_BYTES

    size = rows * (max_prompt_len * 4 + ROW_OVERHEAD_BYTES)
    if size > MAX_MESSAGE_BYTES:
        raise ConfigError(f"a batch of {rows} rows × {max_prompt_len} prompt tokens is up to {size / 2**20:.1f} MiB "
                          f"on the wire, over the {MAX_MESSAGE_BYTES / 2**20:g} MiB frame limit: lower the rows "
                          f"({said('batch_size')}, {said('max_batch_size')} or the strategy's) or "
                          f"{said('max_prompt_len')}")


ROW_OVERHEAD_BYTES = 32  # a Dispatch row's id, lengths and headers besides its token ids


def _check_trace(dataset: str) -> None:
    """A trace that cannot be used is a ConfigError now, before any folder or process (read once: cached)."""
    from batchlab.traffic.datasets import DatasetError
    from batchlab.traffic.traces import is_trace_dataset, load_trace

    if is_trace_dataset(dataset):
        try:
            load_trace(dataset)
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None


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
    if cfg.concurrency:  # closed loop takes the schedule's requests in order: its own times are not replayed
        values = {k: v for k, v in values.items() if k not in ("rate", "arrival", "burstiness")}
    unknown = {k: None for k in TRAFFIC_FIELDS if k not in values and k != "max_new_tokens"}
    return cfg.model_copy(update={**values, "extra": {**unknown, **cfg.extra}})


def _refuse_conflicts(given: dict, saved: dict) -> None:
    """ConfigError for the first option given whose value differs from the schedule's."""
    for name, value in given.items():
        if name in ("prompt_lengths", "output_lengths"):
            value = _lengths_text(name, value)
        if value != saved.get(name):
            raise ConfigError(f"{said(name, value)} conflicts with the replayed schedule "
                              f"({name} {value_text(saved.get(name))}); drop it or build a new schedule")


def value_text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
