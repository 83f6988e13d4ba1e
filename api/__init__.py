"""batchlab from Python: what the commands do, as functions that take typed settings (or their mapping or YAML)
and return typed results whose runs read as pandas DataFrames: run, sweep, capacity, simulate, tune, calibrate,
report, and load (a folder's runs). README's "From Python" and examples/notebook.py show them. One plan and one
vocabulary: sweep, capacity and simulate take a Plan, a sweep's mapping (base: and grid:) or a run's settings,
or a YAML file's path; `**changes` lay settings over it, by the same names everywhere. A strategy may be the
class itself (batchlab.api.strategy has what its author needs). Progress goes to the `on_progress` callback, an
Event at a time; every error a user's input or a run's fault causes is a BatchlabError. Importing this package
starts nothing, changes no signal handler and loads no model; a script that calls run or sweep needs the
`if __name__ == "__main__":` guard (runs start their processes with multiprocessing's spawn; a notebook does not).
"""
from importlib import import_module

from batchlab.api.progress import Event, EventKind, OnProgress, log_progress, print_progress
from batchlab.api.results import (Candidate, CapacityProbe, CapacityResult, PointKey, PointRecord, RunResult,
                                  SimulationResult, StrategyCapacity, SweepResult, TuneResult)
from batchlab.api.runs import calibrate, load, report, run, run_config, tune
from batchlab.api.sweeps import capacity, plan_of, simulate, sweep
from batchlab.protocol.errors import (BackendError, BatchlabError, CalibrateError, ClusterError,  # noqa: F401
                                      ConfigError, DatasetError, ReportError, RunFailed, RunTimeout, SummaryError,
                                      SweepError)

ERRORS = ["BatchlabError", "ConfigError", "SweepError", "ClusterError", "DatasetError", "BackendError",
          "CalibrateError", "SummaryError", "ReportError", "RunFailed", "RunTimeout"]
_LAZY = {  # name → its module, imported on first use (keeps `import batchlab.api` light)
    "RunConfig": "batchlab.protocol.settings", "Summary": "batchlab.collector.summary",
    "Plan": "batchlab.lab.sweep_plan", "Point": "batchlab.lab.sweep_plan", "Report": "batchlab.report.build",
    "CalibrateResult": "batchlab.api.calibration",
    "RaySettings": "batchlab.protocol.study_settings", "CalibrateSettings": "batchlab.protocol.study_settings",
    "Policy": "batchlab.api.strategy", "Decision": "batchlab.api.strategy", "Capacity": "batchlab.api.strategy",
}

__all__ = ["run", "sweep", "capacity", "simulate", "tune", "calibrate", "report", "load", "run_config", "plan_of",
           "Event", "EventKind", "OnProgress", "log_progress", "print_progress", "SweepResult", "SimulationResult",
           "RunResult", "CapacityResult", "StrategyCapacity", "CapacityProbe", "TuneResult", "Candidate", "PointRecord",
           "PointKey",
           *ERRORS, *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'batchlab.api' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
