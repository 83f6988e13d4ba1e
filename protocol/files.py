"""Atomic file writes: a temporary sibling is written, then renamed over the target, so a reader (or a
crash mid-write) never sees half a file. Every package writes its files through these."""
import json
import os
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from batchlab.protocol.errors import ConfigError, term


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temporary sibling of `path`, which then replaces `path` in one rename; the
    temporary file never outlives a failed write. Its name carries the pid, so concurrent writers of one
    path do not collide (the last rename wins)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` into `path`, atomically."""
    write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json_atomic(path: str | Path, data: object, **dumps_kwargs: object) -> None:
    """`data` as indented JSON into `path`, atomically (`dumps_kwargs` go to json.dumps)."""
    write_text_atomic(path, json.dumps(data, indent=2, **dumps_kwargs))


def output_folder(path: str | Path, flag: str = "--out", name: str = "out") -> Path:
    """`path` as a folder a job writes into, made with its parents when missing; ConfigError naming the setting
    (`flag` on the command line, `name` from Python) when it is empty, a file, or cannot be made (no such
    parent, no permission, a read-only file system)."""
    said = term(flag, name)
    if not str(path).strip():
        raise ConfigError(f"{said} must name a folder")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{said} {path} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{said} {path}: cannot make the folder ({exc.strerror or exc})") from None
    return folder


def yaml_text(data: object) -> str:
    """`data` as YAML of safe types, in its own key order; an enum (a request status, a batching mode) as its
    value, which is what files hold (PyYAML's safe dumper refuses a StrEnum member)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_multi_representer(Enum, lambda dumper, value: dumper.represent_data(value.value))
    return yaml.dump(data, Dumper=Dumper, sort_keys=False)
