"""A warm worker: one backend, built and warmed once, serving run after run (a sweep's points that share
its settings; see runner/pool.py). Each run is a `Session`; worker.process.Worker serves it."""
from dataclasses import dataclass

from batchlab.protocol import now
from batchlab.protocol.signals import on_stop_signal
from batchlab.worker.process import Worker


@dataclass(slots=True)
class Session:
    """One run that a warm worker joins: where its scheduler and collector listen, and its folder."""

    scheduler_addr: str
    collector_addr: str
    out_dir: str


def serve_sessions(make_backend, next_session, worker_id: str, keys: str | None = None,
                   on_session=None, run_over=None) -> int:
    """A warm worker: build and warm the backend once, then join run after run.

    `next_session(timeout_s)` returns the next Session, None to end, or raises queue.Empty; between
    runs the backend is reset (`reset()`: no rows, no cached prefixes, fresh peak memory), so no run
    inherits another's state. `on_session(session)` runs first in each (per-run logs); `run_over()` says
    the launcher has moved on (a run whose scheduler never came up is then left). SIGINT/SIGTERM end
    the current run after its step, then the process.
    """
    import queue

    state: dict = {"exit": False, "worker": None}

    def on_signal(_signum: int) -> None:
        state["exit"] = True
        if state["worker"] is not None:
            state["worker"].stopping = True

    with on_stop_signal(on_signal):
        started = now()
        backend = make_backend()
        try:
            backend.warmup()
            backend.info.facts["startup_s"] = round(now() - started, 3)  # load + warm-up, once
            runs = 0
            while not state["exit"]:
                try:
                    session = next_session(0.5)
                except queue.Empty:
                    continue
                if session is None:
                    break
                if on_session is not None:
                    on_session(session)
                if runs:
                    backend.reset()
                backend.info.facts["warm_runs_before"] = runs  # 0: this run paid the start-up
                state["worker"] = Worker(backend, session.scheduler_addr, session.collector_addr, worker_id,
                                         keys, run_over)
                try:
                    state["worker"].run()
                finally:
                    state["worker"].close(close_backend=False)
                    state["worker"] = None
                runs += 1
        finally:
            backend.close()
    return 0
