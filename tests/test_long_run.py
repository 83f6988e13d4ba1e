"""Long runs keep memory that follows what is in flight: no Python object per token in the collector's
store once a request's rows are taken, nothing but a bit per request once it has left the store, and
none per prompt token in a loaded schedule. (Peak RSS over millions of rows is measured by
benchmarks/long_run.py, not asserted here.)"""
import numpy as np

from batchlab.collector.parts import PartWriter, load_table
from batchlab.collector.request import EndedIds, TokenBuffer
from batchlab.collector.store import RunStore
from batchlab.collector.store import KEEP_TAKES
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RequestMsg, RunInfo, Tokens
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.schedule import build_schedule, load_schedule, save_schedule


def _continuous_requests(store: RunStore, first: int, n: int, tokens_each: int) -> None:
    """n requests of one pass, a batch each (batch id = request id), stepped together."""
    rids = list(range(first, first + n))
    for rid in rids:
        store.handle(Arrival(RequestMsg(rid, 0.0, 0.0, 4, tokens_each), 0.0))
    store.handle(BatchLaunch("w0", 0.1, "credit", rids, rids, 0))
    for i in range(tokens_each):
        store.handle(Tokens(i, 1.0 + i, rids, rids, [i] * n))


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
        assert store.tokens == {} and store.batch_requests == {}
    assert {s.taken[0] for s in store.requests.values()} == {20}


def test_ended_requests_and_their_batches_leave_the_store_after_keep_takes(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    store.handle(RunInfo({"t0": 0.0}))
    for first in range(0, 3000, 100):
        _continuous_requests(store, first, 100, 5)
        for rid in range(first, first + 100):
            store.handle(BatchDone(rid, "w0", 0.1, 30.0, [rid], [], False, 0))
        writer.write(store.take_parts())
        assert len(store.requests) == len(store.launches) == len(store.dones) <= 100 * KEEP_TAKES
    for _ in range(KEEP_TAKES):  # nothing new: what was written leaves
        writer.write(store.take_parts())
    assert store.requests == {} and store.launches == {} and store.dones == {} and store.batch_refs == {}
    assert not store.engine_metrics and not store.taking._taken_batches and not store.tokens
    assert all(rid in store.ended for rid in range(3000)) and len(store.ended._bits) <= 3000 // 8 * 2
    requests = load_table(tmp_path, "requests")
    assert sorted(requests.request_id) == list(range(3000)) and set(requests.n_tokens) == {5}


def test_ended_ids_are_a_set_of_ints():
    ended, ids = EndedIds(), [0, 7, 8, 1 << 26, -3, 123_456, 2**40]
    for rid in ids:
        ended.add(rid)
    assert all(rid in ended for rid in ids)
    assert not any(rid in ended for rid in (1, 6, 9, (1 << 26) - 1, -2, 123_457, 2**40 + 1, "7", 7.0))


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
