"""The collector: joins every process's events by request id and writes the run's tables.

`metrics` and `store` import no zmq (the report and the simulator reuse them); `run_collector`
(the process, which needs zmq) is imported on first use.
"""
from collector.parts import load_table
from collector.store import RunStore
from collector.tables import Tables

__all__ = ["RunStore", "Tables", "load_table", "run_collector"]


def __getattr__(name: str) -> object:
    if name == "run_collector":
        from collector.process import run_collector
        return run_collector
    raise AttributeError(name)
