"""Long runs keep memory that follows what is in flight: no Python object per token in the collector's
store once a request's rows are taken, and none per prompt token in a loaded schedule. (Peak RSS over
millions of rows is measured by benchmarks/long_run.py, not asserted here.)"""
import numpy as np

from batchlab.collector.parts import PartWriter
from batchlab.collector.store import RunStore, TokenBuffer
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RunInfo, Tokens
from batchlab.protocol.messages import STEP_BATCH
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.schedule import build_schedule, load_schedule, save_schedule


def _continuous_requests(store: RunStore, first: int, n: int, tokens_each: int) -> None:
    for rid in range(first, first + n):
        store.handle(Arrival(rid, 0.0, 0.0, 0.0, 4, tokens_each))
        store.handle(BatchLaunch(rid, "w0", 0.1, "credit", [rid], 0))
    rids = list(range(first, first + n))
    for i in range(tokens_each):
        store.handle(Tokens(STEP_BATCH, i, 1.0 + i, rids, [i] * n))


def test_in_flight_tokens_live_in_typed_arrays_not_python_tuples():
    store = RunStore()
    store.handle(RunInfo({"t0": 0.0}))
    _continuous_requests(store, 0, 3, 50)
    assert all(type(buf) is TokenBuffer and len(buf) == 50 for buf in store.tokens.values())
    assert {buf.times.typecode for buf in store.tokens.values()} == {"d"}


def test_the_store_holds_no_tokens_of_ended_requests_however_many_came(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    store.handle(RunInfo({"t0": 0.0}))
    for first in range(0, 400, 100):
        _continuous_requests(store, first, 100, 20)
        for rid in range(first, first + 100):
            store.handle(BatchDone(rid, "w0", 0.1, 30.0, [rid], [], False, 0))
        writer.write(store.take_parts())
        assert store.tokens == {} and store.batch_requests == {} and not store._early_tokens
    assert {s.taken[0] for s in store.requests.values()} == {20}


def test_a_loaded_schedule_keeps_prompt_tokens_as_array_views(tmp_path):
    cfg = TrafficConfig(arrival="poisson", rate=50.0, duration_s=2.0, seed=3, dataset="synthetic",
                        prompt_lengths=LengthSpec(dist="fixed", mean=16))
    schedule = build_schedule(cfg, None)
    save_schedule(schedule, tmp_path / "s.parquet")
    loaded = load_schedule(tmp_path / "s.parquet")
    tokens = loaded.frame["prompt_tokens"]
    assert all(isinstance(t, np.ndarray) and t.base is not None for t in tokens)  # views, no per-token ints
    assert [t.tolist() for t in tokens] == [list(t) for t in schedule.frame["prompt_tokens"]]
    assert loaded.content_hash == schedule.content_hash
