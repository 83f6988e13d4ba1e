"""The collector: joins every process's events by request id and writes the run's tables.

`metrics` and `store` import no zmq (the report and the simulator reuse them); `run_collector`
(the process, which needs zmq) is imported on first use.
"""
from batchlab.collector.parts import load_table
from batchlab.collector.store import RunStore
from batchlab.collector.tables import Tables

__all__ = ["RunStore", "Tables", "load_table", "run_collector"]


def __getattr__(name: str) -> object:
    if name == "run_collector":
        from batchlab.collector.process import run_collector
        return run_collector
    raise AttributeError(name)
