"""How a CPU worker shares the machine's cores: its intra-op threads, how OpenMP's idle threads wait, and
whether it is pinned to cores the harness keeps off.

A model on the CPU splits each operator over `torch.get_num_threads()` OpenMP threads that meet at a barrier
after every operator. With as many threads as cores, one neighbour (another process, or the run's own
traffic, scheduler and collector) holding a core makes every barrier wait for the thread that lost its core,
and OpenMP's spinning waiters burn the time the neighbour needs: the worker slows far more than its share of
the cores. The policies measured (benchmarks/thread_policy.py, docs/workers.md "Sharing the cores") are:

- `torch`: torch's own default (threads = cores, OpenMP's default waiting);
- `all`: threads = cores, idle threads sleep (OMP_WAIT_POLICY=PASSIVE);
- `spare`: threads = cores − 1 (at least 1), passive: one core left for the harness and any neighbour;
- `one`: a single thread;
- `pinned`: `spare`, with the worker bound to the first cores − 1 CPUs and the harness processes (traffic,
  scheduler, collector, launcher) to the last one, where the OS allows it (Linux).

`auto` is the default chosen from the figures (AUTO_POLICY). A number N asks for N threads (passive). The
thread count and wait policy must be set before torch (its OpenMP runtime) is first imported in the
process: `apply_before_import` sets the environment, `apply_torch` the count once torch is loaded.
"""
import os
from dataclasses import dataclass

from batchlab.protocol.setting_groups import THREAD_POLICIES as POLICIES  # noqa: F401 (the names, declared once)

CPU_BACKENDS = ("hf", "vllm")  # the backends whose model runs torch's intra-op threads here
AUTO_POLICY = "spare"  # chosen from benchmarks/thread_policy.py's table (docs/workers.md)


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one, else all)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity masks
        return list(range(os.cpu_count() or 1))


@dataclass(slots=True)
class ThreadPlan:
    """What a policy means on this machine: the worker's threads, OpenMP's wait, the worker's and the
    harness's CPUs (empty: not pinned)."""

    policy: str
    threads: int  # 0: torch's own default (not set)
    wait: str  # "passive", or "" for OpenMP's default
    worker_cpus: list[int]
    harness_cpus: list[int]

    def facts(self) -> dict:
        """The run's record of it (the worker's facts)."""
        return {"thread_policy": self.policy, "intra_op_threads": self.threads or "torch default",
                "omp_wait_policy": self.wait or "default", "worker_cpus": self.worker_cpus or "any",
                "harness_cpus": self.harness_cpus or "any"}


def plan(policy: str, cpus: list[int] | None = None) -> ThreadPlan:
    """The plan of `policy` (a name or a thread count) on `cpus` (default: the usable ones)."""
    cpus = usable_cpus() if cpus is None else cpus
    name = AUTO_POLICY if policy == "auto" else policy
    spare = max(len(cpus) - 1, 1)
    if name.isdigit():
        return ThreadPlan(policy, int(name), "passive", [], [])
    if name == "torch":
        return ThreadPlan(policy, 0, "", [], [])
    if name == "pinned" and len(cpus) >= 2:
        return ThreadPlan(policy, spare, "passive", cpus[:spare], cpus[spare:])
    threads = {"all": len(cpus), "spare": spare, "one": 1, "pinned": spare}[name]
    return ThreadPlan(policy, threads, "passive", [], [])


def apply_before_import(p: ThreadPlan) -> None:
    """Before torch is imported in this process: OpenMP's thread count and wait policy (read once, when
    its runtime starts), and the worker's CPUs. A value the user set in the environment stands."""
    if p.threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(p.threads))
    if p.wait:
        os.environ.setdefault("OMP_WAIT_POLICY", p.wait.upper())
    if p.worker_cpus:
        pin_to(p.worker_cpus)


def apply_torch(p: ThreadPlan) -> None:
    """Once torch is loaded: its intra-op thread count (the environment may have been read earlier)."""
    if p.threads:
        import torch

        torch.set_num_threads(p.threads)


def pin_to(cpus: list[int]) -> bool:
    """Bind this process (and the threads it starts later) to `cpus`; False where the OS cannot."""
    try:
        os.sched_setaffinity(0, cpus)
        return True
    except (AttributeError, OSError, ValueError):
        return False


def harness_cpus(cfg) -> list[int]:
    """The CPUs a run's harness roles (traffic, scheduler, collector) keep to: a pinned CPU worker's last
    core; [] (anywhere) otherwise."""
    if getattr(cfg, "backend", "") not in CPU_BACKENDS:
        return []
    return plan(cfg.cpu_threads).harness_cpus


def place_harness(cfg) -> None:
    """In a harness role's process: keep off a pinned worker's cores (nothing for any other policy)."""
    if cpus := harness_cpus(cfg):
        pin_to(cpus)


def place_worker(cfg) -> ThreadPlan | None:
    """In a worker's process, before its backend imports torch: the run's thread plan applied (hf and vllm
    backends; None for the others, which run no intra-op threads)."""
    if cfg.backend not in CPU_BACKENDS:
        return None
    p = plan(cfg.cpu_threads)
    apply_before_import(p)
    apply_torch(p)
    return p
