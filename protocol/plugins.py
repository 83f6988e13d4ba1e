"""Plugins found by name, resolved once: a built-in, an installed entry point of the kind's group, or
`package.module:Class` (importable: installed, or on PYTHONPATH). Strategies (scheduler.strategies) and
worker backends (worker.factory) are found this way, so a new one is a file outside batchlab.

From Python a plugin may also be given as the class itself (`class_spec`): one that its module:Class name
imports back is named so; one no other process can import by name (defined in a notebook, a script's
__main__ or a function: a spawned process has no such module) travels by value, pickled with cloudpickle."""
import hashlib
import importlib
import inspect
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

STRATEGY_GROUP = "batchlab.strategies"
BACKEND_GROUP = "batchlab.backends"


DIGEST_CHARS = 16
_BY_VALUE: dict[str, type] = {}  # a class's code digest → the class (this process's own, or unpickled once here)


def class_spec(obj: type) -> tuple[str, bytes]:
    """A class given as an object: its `module:Qualname`, and b"" when that name imports this very class back,
    else the class pickled by value (cloudpickle) for processes that cannot import it by name."""
    spec = f"{obj.__module__}:{obj.__qualname__}"
    if _importable(obj):
        return spec, b""
    import cloudpickle

    code = cloudpickle.dumps(obj)
    _BY_VALUE.setdefault(_key(code), obj)
    return spec, code


def _importable(obj: type) -> bool:
    if obj.__module__ in ("__main__", "__mp_main__") or "<locals>" in obj.__qualname__:
        return False
    try:
        found = importlib.import_module(obj.__module__)
        for part in obj.__qualname__.split("."):
            found = getattr(found, part)
    except Exception:  # a module that imports only in its own process: by value, then
        return False
    return found is obj


def class_digest(cls: type) -> str:
    """A short sha256 of what a class does, for a run's identity: its members' source (without a source, their
    bytecode), nested classes (a Params dataclass) alike. The pickle would not do: it holds a random id per
    class and the notebook cell's file name, which change with every session."""
    digest = hashlib.sha256()
    _feed(digest, cls, depth=3)
    return "sha256:" + digest.hexdigest()[:DIGEST_CHARS]


def _feed(digest, value: object, depth: int) -> None:
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    if isinstance(value, type) and depth:
        digest.update(f"class {value.__qualname__}({[b.__qualname__ for b in value.__bases__]})".encode())
        for name, member in sorted(value.__dict__.items()):
            if name not in ("__dict__", "__weakref__", "__module__", "__doc__", "__dataclass_fields__"):
                digest.update(name.encode())
                _feed(digest, member, depth - 1)
    elif hasattr(value, "__code__"):
        try:
            digest.update(inspect.getsource(value).encode())
        except (OSError, TypeError):  # defined where no source is kept (exec of a string, a dataclass's __init__)
            digest.update(value.__code__.co_code + repr(value.__code__.co_names).encode())
    elif isinstance(value, property):
        for part in (value.fget, value.fset):
            _feed(digest, part, depth)
    else:  # a constant; an object's address is no part of what it is
        digest.update(re.sub(r" at 0x[0-9a-f]+", "", repr(value)).encode())


def _key(code: bytes) -> str:
    return hashlib.sha256(code).hexdigest()


def from_code(code: bytes) -> type:
    """The class `class_spec` pickled (the very object where it was pickled; unpickled once elsewhere)."""
    key = _key(code)
    if key not in _BY_VALUE:
        _BY_VALUE[key] = pickle.loads(code)  # noqa: S301  (bytes this user's own process pickled, never a file)
    return _BY_VALUE[key]


def entry_point_names(group: str) -> list[str]:
    """The names installed under the entry-point `group`, sorted."""
    return sorted(ep.name for ep in metadata.entry_points(group=group))


@dataclass(frozen=True, slots=True)
class Registry:
    """One kind of plugin. `builtins` maps a name to its object, or to the `module:Class` imported only
    when that name is asked for (heavy imports wait for the one chosen)."""

    kind: str  # "strategy", "backend": the word its errors use
    group: str  # the entry-point group
    builtins: Mapping[str, object]
    error: type[Exception] = ValueError  # what a bad name raises (the callers' ConfigError)

    def names(self) -> list[str]:
        """Every name `load` accepts besides package.module:Class."""
        return [*self.builtins, *entry_point_names(self.group)]

    def load(self, spec: str) -> object:
        """The object `spec` names, or `error` saying why not."""
        found = self.builtins.get(spec, spec)
        if not isinstance(found, str):
            return found
        return self._import(found) if ":" in found else self._entry_point(found)

    def _entry_point(self, name: str) -> object:
        found = [ep for ep in metadata.entry_points(group=self.group) if ep.name == name]
        if not found:
            raise self.error(f"unknown {self.kind} {name!r} (choose from {', '.join(self.names())}, "
                             f"or give package.module:Class)")
        try:
            return found[0].load()
        except Exception as exc:  # ImportError, SyntaxError, or whatever its module raises at import
            raise self.error(f"{self.kind} {name}: entry point {found[0].value} does not load "
                             f"({type(exc).__name__}: {exc})") from None

    def _import(self, spec: str) -> object:
        """package.module:Qual.Name (the module importable: installed, or on PYTHONPATH)."""
        module_name, _, qualname = spec.partition(":")
        try:
            obj = importlib.import_module(module_name)
        except ImportError as exc:
            raise self.error(f"{self.kind} {spec}: cannot import {module_name} ({exc}; is it on PYTHONPATH?)") from None
        except Exception as exc:  # a SyntaxError, or an error its module raised at import
            raise self.error(f"{self.kind} {spec}: importing {module_name} raised {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())}") from None
        try:
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise self.error(f"{self.kind} {spec}: module {module_name} has no {qualname!r}") from None
        return obj
