"""A worker never runs more rows than it announced: the cap it announces is the strategy's own."""
import pytest

from batchlab.protocol.settings import build_config
from batchlab.scheduler.strategies import resolve
from batchlab.worker.factory import make_backend
from batchlab.worker.sim import ContinuousCore
from batchlab.worker.stepmodel import get_preset


def test_max_batch_size_is_a_continuous_workers_cap_even_below_the_default_batch_size():
    cfg = build_config({"backend": "sim", "strategy": "continuous", "max_batch_size": 4}, {})
    assert cfg.batch_size == 8  # the default naive batch size must not widen the cap
    strategy = resolve(cfg)
    assert strategy.rows == 4 and make_backend(cfg, strategy.mode, strategy.rows).info.max_batch_size == 4


def test_naive_workers_take_the_naive_batch_size_and_dynamic_its_cap():
    naive = build_config({"backend": "sim", "strategy": "naive", "batch_size": 6, "max_batch_size": 16}, {})
    dynamic = build_config({"backend": "sim", "strategy": "dynamic", "batch_size": 6, "max_batch_size": 16}, {})
    assert (resolve(naive).rows, resolve(dynamic).rows) == (6, 16)


def test_the_continuous_core_holds_joiners_beyond_its_cap_until_a_row_is_free():
    core = ContinuousCore(get_preset("a100-llama2-7b"), max_rows=2)
    for i in range(3):
        core.admit(i, 4, 3 if i == 0 else 10)
    running = []
    while core.has_work():
        running.append(core.plan_step().running)
    assert max(running) == 2 and core.held_back > 0
    assert sum(running) == 3 + 10 + 10  # every token of every row, none lost


@pytest.mark.slow  # real worker process
def test_a_warm_worker_leaves_a_run_whose_scheduler_never_came_up(tmp_path):
    import queue
    import threading

    from batchlab.worker.process import Session, serve_sessions
    from batchlab.worker.sim import SimBackend

    sessions: queue.Queue = queue.Queue()
    sessions.put(Session(f"ipc://{tmp_path}/never.sock", f"ipc://{tmp_path}/coll.sock", str(tmp_path)))
    done = threading.Event()
    thread = threading.Thread(target=lambda: (serve_sessions(lambda: SimBackend("a100-llama2-7b"),
                                                             lambda t: sessions.get(timeout=t), "worker-0",
                                                             run_over=lambda: not sessions.empty()),
                                              done.set()), daemon=True)
    thread.start()
    assert not done.wait(1.0)  # it waits for that run's scheduler ...
    sessions.put(None)  # ... until the launcher moves on (here: ends the pool)
    assert done.wait(60), "the warm worker stayed in a run that was over"
