"""One error hierarchy in one module (protocol/errors.py): no other module defines an exception class a caller
can meet, every class there is a BatchlabError, and a message names a setting in its reader's vocabulary."""
import ast

import pytest

from batchlab import api
from batchlab.protocol import errors
from batchlab.protocol.errors import BatchlabError, ConfigError, command_line_vocabulary, term
from tests.test_layers import PACKAGES, ROOT

# Exceptions that are control flow inside one process and never reach a caller: why each stays where it is.
INTERNAL = {
    "worker/backend.py:OutOfMemory": "a batch that did not fit: the worker requeues it and carries on",
    "worker/process.py:WorkerStopping": "the worker's loop unwinding on a Shutdown",
    "protocol/signals.py:Terminated": "a SIGTERM or SIGHUP turned into a Ctrl-C (a KeyboardInterrupt, not an error)",
    "report/external.py:Unreadable": "a peer's file the report cannot parse: caught there, one line of its refusal",
    "worker/run_steps.py:RunStepsError": "a run's tables that cannot give its steps: calibrate's CalibrateError line",
}


def _exception_classes() -> dict[str, list[str]]:
    """'file:Class' → its base names, for every class outside protocol/errors.py whose base is an exception."""
    error_names = {n for n in dir(errors) if isinstance(getattr(errors, n), type)
                   and issubclass(getattr(errors, n), BaseException)}
    builtin_errors = {n for n in dir(__import__("builtins")) if isinstance(getattr(__import__("builtins"), n), type)
                      and issubclass(getattr(__import__("builtins"), n), BaseException)}
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "protocol/errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                if set(bases) & (error_names | builtin_errors):
                    found[f"{rel}:{node.name}"] = bases
    return found


def test_every_exception_class_a_caller_can_meet_is_declared_in_protocol_errors():
    assert set(_exception_classes()) == set(INTERNAL)


def test_every_class_in_the_errors_module_is_a_batchlab_error_and_the_api_exports_the_public_ones():
    classes = [getattr(errors, n) for n in dir(errors) if isinstance(getattr(errors, n), type)
               and issubclass(getattr(errors, n), BaseException)]
    assert classes and all(issubclass(c, BatchlabError) for c in classes)
    assert all(getattr(api, name) is getattr(errors, name) for name in api.ERRORS)


def test_a_setting_is_named_by_its_python_name_and_inside_a_command_by_its_option():
    with pytest.raises(ConfigError, match=r"^duration_s must be > 0 s, got 0") as python:
        api.RunConfig(duration_s=0)
    with command_line_vocabulary(), pytest.raises(ConfigError, match=r"^--duration must be > 0 s, got 0") as cli:
        api.RunConfig(duration_s=0)
    assert type(python.value) is type(cli.value) is ConfigError
    assert term("--overwrite", "overwrite=True") == "overwrite=True"
