"""Plugins found by name, resolved once: a built-in, an installed entry point of the kind's group, or
`package.module:Class` (importable: installed, or on PYTHONPATH). Strategies (scheduler.strategies) and
worker backends (worker.factory) are found this way, so a new one is a file outside batchlab."""
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata

STRATEGY_GROUP = "batchlab.strategies"
BACKEND_GROUP = "batchlab.backends"


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
