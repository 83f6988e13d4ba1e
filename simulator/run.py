"""One simulated run from a RunConfig: the live run's schedule, policy and step model in virtual time.
Pure: it writes no file (lab.simulate writes a run folder from its tables)."""
from batchlab.collector.tables import Tables
from batchlab.protocol import WorkerHello
from batchlab.protocol.identity import config_hash, run_settings
from batchlab.protocol.settings import RunConfig, parse_bytes
from batchlab.scheduler.strategies import Strategy, resolve
from batchlab.simulator.engine import Simulation
from batchlab.simulator.record import build_tables
from batchlab.traffic.closed_loop import ClientPool
from batchlab.traffic.schedule import Schedule
from batchlab.worker.backend import worker_hello  # the one hello builder, from the one sim BackendInfo
from batchlab.worker.sim import run_speed, sim_info, with_budget
from batchlab.worker.stepmodel import StepModel, get_preset

END_REASON = "simulated"


def step_model(cfg: RunConfig) -> StepModel:
    """The `sim` backend's preset (the echo backend's zero-time model for --backend echo), with the run's
    per-step token budget when it sets one and its speed factor (--speed-noise), as the live sim worker has."""
    model = get_preset("echo" if cfg.backend == "echo" else cfg.preset)
    return with_budget(model, cfg.max_num_batched_tokens).scaled(run_speed(cfg))


def worker_hellos(cfg: RunConfig, strategy: Strategy, model: StepModel) -> list[WorkerHello]:
    """The hellos the live `sim`/`echo` workers of this config would send (see worker/factory.py)."""
    info = sim_info(model, strategy.mode, strategy.rows, backend="echo" if cfg.backend == "echo" else "sim",
                    kv_budget_bytes=parse_bytes(cfg.memory_budget), speed=run_speed(cfg))
    return [worker_hello(f"worker-{i}", info) for i in range(cfg.workers)]


def sim_settings(cfg: RunConfig) -> dict:
    """The settings a live run writes (protocol.identity.run_settings), marked as simulated."""
    settings = run_settings(cfg)
    settings.update(backend="echo" if cfg.backend == "echo" else "sim", simulated=True)
    settings["config_hash"] = config_hash(settings)  # of what it is: a simulation
    return settings


def clients(cfg: RunConfig, schedule: Schedule) -> ClientPool | None:
    """Closed loop (--concurrency): the clients over the schedule, stopped at its duration; None: open loop."""
    if cfg.concurrency <= 0:
        return None
    return ClientPool(cfg.concurrency, schedule.n_requests, cfg.think_time_ms / 1000, schedule.duration_s)


def simulate(cfg: RunConfig, schedule: Schedule, *, slos: dict | None = None) -> Tables:
    """Play `schedule` through cfg's policy and workers in virtual time; the run's tables."""
    strategy, model = resolve(cfg), step_model(cfg)
    sim = Simulation(strategy.policy(), model, worker_hellos(cfg, strategy, model), schedule.frame, settings=sim_settings(cfg),
                     max_queue=cfg.max_queue, max_queue_tokens=cfg.max_queue_tokens, stall_limit_s=cfg.stall_limit_s,
                     clients=clients(cfg, schedule))
    store = sim.run()
    tokens = sim.recorder.attach(store)
    # every schedule row arrives in virtual time, so there are no unsent rows to add from the schedule
    tables = build_tables(store, tokens, None, slos if slos is not None else cfg.slos() or None)  # as live
    tables.summary.end_reason = END_REASON
    return tables
