"""A run's identity: its resolved configuration, canonical, and the hash of it.

Two runs are the same point exactly when their identities are equal; they are repeats of one point
when they are equal but for the seed. The identity is computed from a RunConfig's settings or read
back from any summary.json (its `settings`), so a folder written by an older version still has one.
"""
import hashlib
import json
import math
import os
import platform
from functools import cache

from batchlab.protocol.environment import environment
from batchlab.protocol.settings import RunConfig

# Not part of what was measured: where the files went, the key folder, the path of the replayed
# schedule (its content is: `schedule_hash`), the run's clock origin, the host facts (environment), the
# launcher's start-up limit, and the names a sweep gives a run (its label and repeat number: the seed is
# what a repeat changes).
NOT_IDENTITY = frozenset({"out", "keys", "schedule", "t0", "host", "cpu", "cpu_count", "python",
                          "environment", "config_hash", "label", "repeat", "startup_limit_s"})
HASH_CHARS = 16


def _canonical(value: object) -> object:
    """JSON-stable form: mappings sorted, tuples as lists, integral floats as ints, NaN as text."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return int(value) if value.is_integer() else value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def identity(settings: dict) -> dict:
    """The settings that define what a run measured (RunConfig fields, as RunConfig.as_settings() or a
    summary's `settings` give them), canonical; a summary's per-worker facts count as the worker count.
    A RunConfig field a record lacks (written before the field existed) takes its default, so adding a
    setting does not make every earlier run another configuration."""
    values = {**_defaults(), **{k: v for k, v in settings.items() if k not in NOT_IDENTITY}}
    if not values.get("strategy_sha256"):  # only a strategy class passed by value has one: every other run's
        values.pop("strategy_sha256", None)  # identity, and hash, stays what it was before the key existed
    if isinstance(values.get("workers"), dict):  # the collector's worker facts, by worker id
        values["workers"] = len(values["workers"])
    return _canonical(values)


@cache
def _defaults() -> dict:
    """RunConfig's field defaults (identity keys only; computed once, never mutated: identity copies)."""
    return {k: v for k, v in RunConfig().as_settings().items() if k not in NOT_IDENTITY}


def config_hash(settings: dict, *, ignore: frozenset[str] = frozenset()) -> str:
    """A short sha256 of the identity (less `ignore`d keys)."""
    ident = {k: v for k, v in identity(settings).items() if k not in ignore}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def differences(old: dict, new: dict, *, ignore: frozenset[str] = frozenset()) -> list[str]:
    """'key old → new' for each identity key whose value differs (sorted by key); [] when equal."""
    a, b = identity(old), identity(new)
    keys = sorted((set(a) | set(b)) - ignore)
    return [f"{k} {_show(a.get(k))} → {_show(b.get(k))}" for k in keys if a.get(k) != b.get(k)]


def _show(value: object) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False) if not isinstance(value, str) \
        else repr(value)


def run_settings(cfg: RunConfig) -> dict:
    """The settings written into every table, their identity's hash, plus the host they ran on (the
    scheduler's; each worker's own environment is in its facts)."""
    settings = cfg.as_settings()
    settings.update(config_hash=config_hash(settings), host=platform.node(),
                    cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                    python=platform.python_version(), environment=environment())
    return settings
