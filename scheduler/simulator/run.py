"""One simulated run from a RunConfig: the live run's schedule, policy and step model; its output files."""
import shutil
import time
from pathlib import Path

import yaml

from batchlab.protocol.settings import RunConfig, parse_bytes, run_settings
from batchlab.collector.parts import SCHEDULE_FILE, write_final
from batchlab.collector.tables import Tables
from batchlab.protocol import WorkerHello
from batchlab.scheduler.strategies import Strategy, resolve
from batchlab.scheduler.simulator.engine import Simulation
from batchlab.scheduler.simulator.record import build_tables
from batchlab.traffic.schedule import Schedule, save_schedule
from batchlab.traffic.run_schedule import make_schedule
from batchlab.worker.stepmodel import StepModel, get_preset

END_REASON = "simulated"


def step_model(cfg: RunConfig) -> StepModel:
    """The `sim` backend's preset (the echo backend's zero-time model for --backend echo)."""
    return get_preset("echo" if cfg.backend == "echo" else cfg.preset)


def worker_hellos(cfg: RunConfig, strategy: Strategy, model: StepModel) -> list[WorkerHello]:
    """The hellos the live `sim`/`echo` workers of this config would send (see worker/factory.py)."""
    backend = "echo" if cfg.backend == "echo" else "sim"
    budget_bytes = parse_bytes(cfg.memory_budget) or model.kv_budget_bytes()
    return [WorkerHello(f"worker-{i}", backend, model.name, strategy.mode, strategy.rows, model.kv_bytes_per_token,
                        budget_bytes, "simulated", "none", {"preset": model.as_dict()})
            for i in range(cfg.workers)]


def sim_settings(cfg: RunConfig) -> dict:
    """The settings a live run writes (protocol.settings.run_settings), marked as simulated."""
    settings = run_settings(cfg)
    settings.update(backend="echo" if cfg.backend == "echo" else "sim", simulated=True)
    return settings


def simulate(cfg: RunConfig, schedule: Schedule, *, slos: dict | None = None) -> Tables:
    """Play `schedule` through cfg's policy and workers in virtual time; the run's tables."""
    strategy, model = resolve(cfg), step_model(cfg)
    sim = Simulation(strategy.policy(), model, worker_hellos(cfg, strategy, model), schedule.frame, settings=sim_settings(cfg),
                     max_queue=cfg.max_queue, max_queue_tokens=cfg.max_queue_tokens)
    store = sim.run()
    tokens = sim.recorder.attach(store)
    # every schedule row arrives in virtual time, so there are no unsent rows to add from the schedule
    tables = build_tables(store, tokens, None, slos)
    tables.summary["end_reason"] = END_REASON
    return tables


def write_run(out_dir: Path, cfg: RunConfig, schedule: Schedule, tables: Tables,
              saved_schedule: Path | None = None) -> None:
    """The files a live run leaves: config.yaml, schedule.parquet, the tables and summary.json.
    `saved_schedule`: this schedule's file from an earlier point, copied instead of encoded again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.as_settings(), sort_keys=False))
    if saved_schedule is not None and saved_schedule.is_file():
        shutil.copyfile(saved_schedule, out_dir / SCHEDULE_FILE)
    else:
        save_schedule(schedule, out_dir / SCHEDULE_FILE)
    write_final(out_dir, tables)


def simulate_run(cfg: RunConfig, schedule: Schedule | None = None, *, slos: dict | None = None,
                 saved_schedule: Path | None = None) -> dict:
    """Simulate cfg (building its schedule unless given) into cfg.out; return the summary."""
    start_s = time.perf_counter()
    schedule = schedule if schedule is not None else make_schedule(cfg)
    tables = simulate(cfg, schedule, slos=slos)
    tables.summary["simulation_wall_s"] = time.perf_counter() - start_s
    write_run(Path(cfg.out), cfg, schedule, tables, saved_schedule)
    return tables.summary
