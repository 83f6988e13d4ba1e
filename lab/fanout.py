"""Independent evaluations (tune's candidates, simulate's points) fanned out over local processes or a
Ray cluster, so that many candidates take about the time of the slowest rather than their sum.

`Fanout.map(fn, items, shared)` is `[fn(shared, item) for item in items]`, in order: `shared` (a schedule)
travels once per process or once into Ray's object store, not once per item; `fn` must be a module-level
function (it is pickled by name).
"""
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchlab.protocol.signals import link_spawned_child
from batchlab.runner import remove_temp_of

_SHARED: dict = {}  # in a pool process: the shared argument, set once by the initializer


@dataclass(slots=True)
class Fanout:
    """Where evaluations run: in this process (processes=1), in local processes, or on Ray."""

    processes: int = 1
    ray_address: str | None = None

    def map(self, fn: Callable, items: Sequence, shared: object = None) -> list:
        """[fn(shared, item) for item in items], evaluated where this says; results in order."""
        items = list(items)
        if self.ray_address is not None:
            return _ray_map(self.ray_address, fn, items, shared)
        n = min(self.processes or os.cpu_count() or 1, len(items))
        if n <= 1:
            return [fn(shared, item) for item in items]
        return _process_map(n, fn, items, shared)


def _process_map(n: int, fn: Callable, items: list, shared: object) -> list:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    chunk = max(1, len(items) // (4 * n))  # a few chunks per process: even ends, little overhead
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn"), initializer=_start_pool_process,
                             initargs=(shared,)) as pool:
        return list(pool.map(_call_shared, [fn] * len(items), items, chunksize=chunk))


def _start_pool_process(shared: object) -> None:
    """A pool process's entry: linked to its parent (SIGTERM when it ends, as a run's roles are), then the
    shared argument kept."""
    import multiprocessing as mp

    parent = mp.parent_process().pid
    link_spawned_child(parent, lambda: remove_temp_of(parent))
    _SHARED["value"] = shared


def _call_shared(fn: Callable, item: object):
    return fn(_SHARED.get("value"), item)


def _ray_map(address: str, fn: Callable, items: list, shared: object) -> list:
    """One Ray task per item (1 CPU each), the shared argument put in the object store once."""
    from batchlab.lab.ray_cluster import connect

    ray = connect(address)
    task = ray.remote(num_cpus=1, max_retries=3)(_call)  # retried elsewhere when a node is lost
    shared_ref = ray.put(shared)
    refs = [task.remote(fn, shared_ref, item) for item in items]
    try:
        return ray.get(refs)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise


def _call(fn: Callable, shared: object, item: object):
    return fn(shared, item)
