"""Workers kept warm across the runs of a sweep that share their settings.

Loading a model and starting an engine is paid once per group of points (vLLM's CPU engine compiles
its graph for tens of seconds; Mistral-7B takes minutes to load on a GPU box). Each point's scheduler
and collector are new; the warm worker joins them as a `worker.process.Session`, and its backend is
reset between points (no rows, an empty prefix cache, a fresh peak-memory reading), so no point
inherits another's state. A sweep whose points interleave strategies keeps every group's pool alive
(idle pools wait on a queue: memory, no CPU); a grouped sweep keeps one at a time, since two engines
would compete for one GPU's memory.
"""
import contextlib
import logging
import multiprocessing as mp
import signal
from pathlib import Path

from batchlab.runner import procs, roles
from batchlab.protocol.settings import RunConfig
from batchlab.runner.launcher import STOP_GRACE_S, start_role
from batchlab.runner.procs import Child
from batchlab.protocol.addresses import Addresses
from batchlab.scheduler.strategies import resolve
from batchlab.worker.process import Session

log = logging.getLogger("batchlab.pool")

# RunConfig fields that shape the traffic, the scheduler or the output folder, never the worker
RUN_ONLY = frozenset({"strategy", "rate", "duration_s", "arrival", "burstiness", "dataset", "schedule",
                      "max_wait_ms", "max_new_tokens", "max_prompt_len", "seed", "out", "max_queue",
                      "max_queue_tokens", "stall_limit_s", "label", "repeat", "concurrency", "think_time_ms",
                      "num_requests", "extra"})  # num_requests: a saturated run's pool of prompts (the traffic's)


def worker_key(cfg: RunConfig) -> tuple | None:
    """What a run's workers are built from; runs with equal keys can share warm workers. None: never
    pooled (the openai backend holds no model: the server it talks to is the user's)."""
    if cfg.backend == "openai":
        return None
    values = {name: getattr(cfg, name) for name in RunConfig.model_fields if name not in RUN_ONLY}
    strategy = resolve(cfg)
    values.update(mode=str(strategy.mode), rows=strategy.rows)
    if cfg.speed_noise or cfg.speed_drift or cfg.neighbour_share:  # a sim worker's speed is drawn per run
        # (worker.sim.run_speed, worker.machine_noise): no run shares one
        values.update(seed=cfg.seed, repeat=cfg.repeat, label=cfg.label)
    return tuple(sorted((k, repr(v)) for k, v in values.items()))


class WorkerPool:
    """cfg.workers warm worker processes built from one run's settings."""

    def __init__(self, cfg: RunConfig, log_dir: Path) -> None:
        self.key = worker_key(cfg)
        procs.start_resource_tracker()  # before its queues register with it: a hangup to the group must spare it
        ctx = mp.get_context("spawn")
        self.queues = [ctx.Queue() for _ in range(cfg.workers)]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children = [start_role(ctx, f"worker-{i}", roles.warm_worker_role, cfg, f"worker-{i}", q,
                                    out_dir=str(log_dir))
                         for i, q in enumerate(self.queues)]
        log.info("warm workers started for %s/%s: pids %s", cfg.backend, cfg.model,
                 [c.proc.pid for c in self.children])

    def alive(self) -> bool:
        """True while every worker of the pool lives."""
        return all(c.proc.is_alive() for c in self.children)

    def join(self, addrs: Addresses, out_dir: str) -> list[Child]:
        """Send every worker to this run; returns them (for the launcher's liveness watch)."""
        for q in self.queues:
            q.put(Session(addrs.scheduler, addrs.collector, out_dir))
        return self.children

    def close(self) -> None:
        """Tell every worker to end, then stop and reap whatever did not (process groups included)."""
        for q in self.queues:
            with contextlib.suppress(ValueError, OSError):
                q.put(None)
        procs.stop(self.children, signal.SIGTERM, STOP_GRACE_S)
        for q in self.queues:
            q.close()
            q.join_thread()


class PoolKeeper:
    """Holds a sweep's warm pools, one per worker key: a run gets the pool of its key, a fresh one when a
    worker of it died. With keep_all=False at most one pool lives (the old one is closed before a new
    one starts); with keep_all=True every pool stays warm until the sweep ends."""

    def __init__(self, log_dir: Path, keep_all: bool = False) -> None:
        self.log_dir, self.keep_all, self.pools, self.started = log_dir, keep_all, {}, 0

    def for_config(self, cfg: RunConfig) -> WorkerPool | None:
        """The pool this run's workers come from (None: the run starts its own)."""
        key = worker_key(cfg)
        for other in [k for k, pool in self.pools.items()
                      if (k == key and not pool.alive()) or (k != key and not self.keep_all)]:
            self.pools.pop(other).close()
        if key is None:
            return None
        if key not in self.pools:
            self.pools[key] = WorkerPool(cfg, self.log_dir / f"pool-{self.started}-{cfg.backend}-{cfg.strategy}")
            self.started += 1
        return self.pools[key]

    def close(self) -> None:
        """End every pool."""
        while self.pools:
            self.pools.popitem()[1].close()

    def __enter__(self) -> "PoolKeeper":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
