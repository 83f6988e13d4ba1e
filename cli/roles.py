"""Each role's entry point: what a child process of `batchlab run` (or `batchlab ROLE`) executes."""
import logging
import os
from pathlib import Path

from cli.config import RunConfig

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(out_dir: str | None, role: str) -> None:
    """Log to stderr (warnings) and, with an out dir, to out/logs/ROLE.log (info)."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    handlers[0].setLevel(logging.WARNING)
    if out_dir:
        logs = Path(out_dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(logs / f"{role}.log"))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers, force=True)


def collector_role(cfg: RunConfig, collector_addr: str, slos: dict | None = None) -> int:
    """Receive every event, write the tables."""
    from collector.process import run_collector

    setup_logging(cfg.out, "collector")
    run_collector(collector_addr, Path(cfg.out), slos=slos or cfg.slos() or None, keys=cfg.keys or None)
    return 0


def scheduler_role(cfg: RunConfig, scheduler_addr: str, collector_addr: str, stream_ended=None) -> int:
    """Form batches with the configured strategy."""
    from scheduler.policies import make_policy
    from scheduler.process import run_scheduler

    setup_logging(cfg.out, "scheduler")
    policy = make_policy(cfg.strategy, batch_size=cfg.batch_size, max_batch_size=cfg.max_batch_size,
                         max_wait_ms=cfg.max_wait_ms, max_new_tokens=cfg.max_new_tokens)
    return run_scheduler(policy, scheduler_addr, collector_addr, min_workers=cfg.workers,
                         max_queue=cfg.max_queue, max_queue_tokens=cfg.max_queue_tokens,
                         settings=run_settings(cfg), keys=cfg.keys or None, stream_ended=stream_ended)


def worker_role(cfg: RunConfig, scheduler_addr: str, collector_addr: str, worker_id: str) -> int:
    """Own the model and run what the scheduler dispatches."""
    from worker.factory import make_backend
    from worker.process import run_worker

    setup_logging(cfg.out, worker_id)
    return run_worker(make_backend(cfg), scheduler_addr, collector_addr, worker_id, keys=cfg.keys or None)


def warm_worker_role(cfg: RunConfig, worker_id: str, sessions, on_run_log=None) -> int:
    """A worker kept warm across runs (a sweep's points that share its settings): the backend is built
    once from `cfg`, then joins each run that `sessions` (a multiprocessing queue) hands it."""
    from worker.factory import make_backend
    from worker.sessions import serve_sessions

    def on_session(session) -> None:
        setup_logging(session.out_dir, worker_id)
        if on_run_log is not None:
            on_run_log(session.out_dir)

    setup_logging(None, worker_id)
    return serve_sessions(lambda: make_backend(cfg), lambda timeout_s: sessions.get(timeout=timeout_s),
                          worker_id, keys=cfg.keys or None, on_session=on_session,
                          run_over=lambda: not sessions.empty())  # the launcher queues the next run only
                                                                  # after this one ended


def traffic_role(cfg: RunConfig, scheduler_addr: str, started=None) -> int:
    """Build (or load) the schedule and replay it against the scheduler; set `started` (an event) when
    the scheduler's Start came: the run's own time limit counts from then."""
    from traffic.process import run_traffic

    setup_logging(cfg.out, "traffic")
    target = Path(cfg.out) / "schedule.parquet"
    already_there = bool(cfg.schedule) and Path(cfg.schedule).resolve() == target.resolve()  # the launcher's
    run_traffic(make_schedule(cfg), scheduler_addr, out_dir=None if already_there else Path(cfg.out),
                keys=cfg.keys or None, on_start=None if started is None else (lambda _t0: started.set()))
    return 0


def make_schedule(cfg: RunConfig):
    """The run's schedule: a saved one (replay) or a new one from the seed."""
    from cli.config import ConfigError
    from traffic.schedule import TrafficConfig, build_schedule, load_schedule

    if cfg.schedule:
        return load_schedule(Path(cfg.schedule))
    tcfg = TrafficConfig(arrival=cfg.arrival, rate=cfg.rate, duration_s=cfg.duration_s,
                         burstiness=cfg.burstiness, seed=cfg.seed, dataset=cfg.dataset,
                         max_new_tokens=cfg.max_new_tokens, max_prompt_len=cfg.max_prompt_len)
    try:
        tokenizer = tokenizer_for(cfg)
    except (OSError, ValueError) as exc:  # transformers: a path or hub id that holds no tokenizer
        why = " ".join(str(exc).split())
        raise ConfigError(f"--model {cfg.model}: cannot load its tokenizer ({why})") from None
    return build_schedule(tcfg, tokenizer)


def tokenizer_for(cfg: RunConfig):
    """The model's tokenizer (synthetic prompts need none)."""
    if cfg.dataset == "synthetic":
        return None
    from worker.tokenizers import get_tokenizer

    return get_tokenizer(cfg.model)


def run_settings(cfg: RunConfig) -> dict:
    """The settings written into every table, plus the host they ran on."""
    import platform

    settings = cfg.as_settings()
    settings.update(host=platform.node(), cpu=platform.processor() or platform.machine(),
                    cpu_count=os.cpu_count(), python=platform.python_version())
    return settings
