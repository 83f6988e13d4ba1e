"""batchlab from Python: what the commands do, as functions that take typed settings (or their YAML) and
return typed results: run, sweep, capacity, simulate, tune, report (README's "From Python" shows them
with an example). Progress goes to the `on_progress` callback, an Event at a time; every error a user's
input or a run's fault causes is a BatchlabError. Importing this package starts nothing, changes no signal
handler and loads no model; a script that calls run or sweep needs the `if __name__ == "__main__":` guard
(runs start their processes with multiprocessing's spawn)."""
from importlib import import_module

from batchlab.api.progress import Event, OnProgress, log_progress, print_progress
from batchlab.api.results import CapacityResult, SimulationResult, SweepResult
from batchlab.api.runs import report, run, run_config, simulate, tune
from batchlab.api.sweeps import capacity, plan_of, sweep
from batchlab.protocol.errors import (BackendError, BatchlabError, CalibrateError, ClusterError, ConfigError,
                                      DatasetError, ReportError, RunFailed, RunTimeout, SummaryError, SweepError)

ERRORS = ["BatchlabError", "ConfigError", "SweepError", "ClusterError", "DatasetError", "BackendError",
          "CalibrateError", "SummaryError", "ReportError", "RunFailed", "RunTimeout"]
_LAZY = {  # name → its module, imported on first use (keeps `import batchlab.api` light)
    "RunConfig": "batchlab.protocol.settings", "Summary": "batchlab.collector.summary", "Plan": "batchlab.lab.sweep_plan",
    "Report": "batchlab.report.build", "RaySettings": "batchlab.protocol.study_settings",
    "Policy": "batchlab.api.strategy", "Decision": "batchlab.api.strategy", "Capacity": "batchlab.api.strategy",
}
_ORIGINAL = {"Report": "ReportResult"}

__all__ = ["run", "sweep", "capacity", "simulate", "tune", "report", "run_config", "plan_of", "Event", "OnProgress",
           "log_progress", "print_progress", "SweepResult", "CapacityResult", "SimulationResult", *ERRORS, *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'batchlab.api' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), _ORIGINAL.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
