"""Each role's entry point: what a child process of `batchlab run` (or `batchlab ROLE`) executes."""
import logging
import threading
import time
from pathlib import Path

from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.identity import run_settings
from batchlab.protocol.settings import RunConfig
from batchlab.protocol.sockets import HEARTBEAT_INTERVAL_S
from batchlab.scheduler.gate import PlannedSchedule
from batchlab.scheduler.strategies import resolve
from batchlab.traffic.schedule_file import saved_plan  # pyarrow alone: no pandas in the scheduler's process
from batchlab.worker.threads import place_harness

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(out_dir: str | None, role: str) -> None:
    """Log to stderr (warnings) and, with an out dir, to out/logs/ROLE.log (info)."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    handlers[0].setLevel(logging.WARNING)
    if out_dir:
        logs = RunDir(out_dir).logs
        logs.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logs / f"{role}.log"))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers, force=True)


def collector_role(cfg: RunConfig, collector_addr: str, slos: dict | None = None, stop_run=None, beat=None) -> int:
    """Receive every event, write the tables. `stop_run` (an event) is set when a signal came before
    the run's end: the launcher then stops the run while this process reads on and writes it all. `beat`
    (a shared float), when given, gets time.monotonic() every HEARTBEAT_INTERVAL_S from a thread: the
    launcher's sign that this process runs (its final write included), which a stopped one stops giving."""
    if beat is not None:
        threading.Thread(target=_beat, args=(beat,), name="beat", daemon=True).start()
    from batchlab.collector.process import run_collector

    setup_logging(cfg.out, "collector")
    place_harness(cfg)
    summary = run_collector(collector_addr, Path(cfg.out), slos=slos or cfg.slos() or None,
                            keys=cfg.keys or None, stop_run=stop_run)
    return 128 + summary.stop_signal if summary.stop_signal else 0


def _beat(value) -> None:
    """Set `value` to the time, every heartbeat interval, while this process runs."""
    while True:
        value.value = time.monotonic()
        time.sleep(HEARTBEAT_INTERVAL_S)


def scheduler_role(cfg: RunConfig, scheduler_addr: str, collector_addr: str, stream_ended=None,
                   workers_ended=None) -> int:
    """Form batches with the configured strategy; `workers_ended` (a shared count the launcher keeps) says
    how many of the run's workers ended, so that it is not waited for at start-up."""
    from batchlab.scheduler.process import run_scheduler

    setup_logging(cfg.out, "scheduler")
    place_harness(cfg)
    return run_scheduler(resolve(cfg).policy(), scheduler_addr, collector_addr, min_workers=cfg.workers,
                         max_queue=cfg.max_queue, max_queue_tokens=cfg.max_queue_tokens,
                         settings=run_settings(cfg), keys=cfg.keys or None, stream_ended=stream_ended,
                         liveness_s=cfg.liveness_s, stall_limit_s=cfg.stall_limit_s, workers_ended=workers_ended,
                         planned=planned_schedule(cfg))


def planned_schedule(cfg: RunConfig) -> PlannedSchedule | None:
    """The run's saved schedule (`batchlab run` saves it before any role starts) as the scheduler's gate checks
    each request against it; None without one (a standalone scheduler: the traffic builds its own)."""
    if not cfg.schedule:
        return None
    return PlannedSchedule(*saved_plan(cfg.schedule), closed_loop=cfg.concurrency > 0)


def worker_role(cfg: RunConfig, scheduler_addr: str, collector_addr: str, worker_id: str) -> int:
    """Own the model and run what the scheduler dispatches."""
    from batchlab.worker.factory import make_placed_backend
    from batchlab.worker.process import run_worker

    setup_logging(cfg.out, worker_id)
    strategy = resolve(cfg)  # the worker's mode and rows come from the strategy, never its name
    return run_worker(make_placed_backend(cfg, strategy.mode, strategy.rows), scheduler_addr, collector_addr,
                      worker_id, keys=cfg.keys or None, liveness_s=cfg.liveness_s)


def warm_worker_role(cfg: RunConfig, worker_id: str, sessions) -> int:
    """A worker kept warm across runs (a sweep's points that share its settings): the backend is built
    once from `cfg`, then joins each run that `sessions` (a multiprocessing queue) hands it; at each run
    its terminal output goes into that run's logs/ folder."""
    from batchlab.runner.procs import redirect_output
    from batchlab.worker.factory import make_placed_backend
    from batchlab.worker.process import serve_sessions

    def on_session(session) -> None:
        setup_logging(session.out_dir, worker_id)
        redirect_output(RunDir(session.out_dir).logs / f"{worker_id}.out")

    setup_logging(None, worker_id)
    strategy = resolve(cfg)
    return serve_sessions(lambda: make_placed_backend(cfg, strategy.mode, strategy.rows),
                          lambda timeout_s: sessions.get(timeout=timeout_s), worker_id, keys=cfg.keys or None,
                          on_session=on_session,
                          run_over=lambda: not sessions.empty())  # the launcher queues the next run only after
                                                                  # this one ended


def traffic_role(cfg: RunConfig, scheduler_addr: str, started=None) -> int:
    """Build (or load) the schedule and replay it against the scheduler; set `started` (an event) when
    the scheduler's Start came: the run's own time limit counts from then."""
    from batchlab.traffic.process import ClosedLoop, run_traffic
    from batchlab.traffic.run_schedule import make_schedule
    from batchlab.traffic.saved_schedule import open_saved_schedule

    setup_logging(cfg.out, "traffic")
    place_harness(cfg)
    target = RunDir(cfg.out).schedule
    already_there = bool(cfg.schedule) and Path(cfg.schedule).resolve() == target.resolve()  # the launcher's
    closed = None
    if cfg.concurrency > 0:  # the send times recorded in the run's own schedule file
        closed = ClosedLoop(cfg.concurrency, cfg.think_time_ms / 1000, target)
    # the launcher's own file is read as it is sent (its memory does not grow with the run's length); a closed
    # loop takes its requests by index (and its pool is bounded: traffic.run_schedule.CLOSED_LOOP_POOL_REQUESTS)
    schedule = open_saved_schedule(target) if already_there and closed is None else make_schedule(cfg)
    run_traffic(schedule, scheduler_addr, out_dir=None if already_there else Path(cfg.out),
                keys=cfg.keys or None, on_start=None if started is None else (lambda _t0: started.set()),
                closed=closed, liveness_s=cfg.liveness_s)
    return 0
