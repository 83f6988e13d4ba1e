"""Long runs keep memory that follows what is in flight: no Python object per token in the collector's
store once a request's rows are taken, nothing but a bit per request once it has left the store, and
none per prompt token in a loaded schedule. (Peak RSS over millions of rows is measured by
benchmarks/long_run.py, not asserted here.)"""
import tracemalloc

import numpy as np
import pyarrow.parquet as pq
import pytest

from batchlab.collector.parts import PartWriter, load_table
from batchlab.collector.request import EndedIds, TokenBuffer
from batchlab.collector.store import RunStore
from batchlab.collector.store import KEEP_TAKES
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RequestMsg, RunInfo, Tokens
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.datasets import DatasetError
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.saved_schedule import open_saved_schedule
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


def _saved(path, duration_s: float) -> None:
    """A synthetic schedule of 64-token prompts at 2,000 req/s for `duration_s`, saved to `path`."""
    cfg = TrafficConfig(arrival="poisson", rate=2000.0, duration_s=duration_s, seed=3, dataset="synthetic",
                        prompt_lengths=LengthSpec(dist="fixed", mean=64))
    save_schedule(build_schedule(cfg, None), path)


def _peak_while_sending(path) -> tuple[int, int]:
    """(requests read, the peak of Python's traced memory while the traffic reads them as it sends them)."""
    tracemalloc.start()
    try:
        n = sum(1 for _ in open_saved_schedule(path).requests())
        return n, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_traffic_reads_the_runs_schedule_as_it_sends_it_whatever_its_length(tmp_path):
    """Held whole, a schedule cost the traffic its rows' prompts (1.7 GiB for a 60 s soak at 5,000 req/s);
    read a batch of rows at a time, four times the rows cost no more, and each row is the saved one."""
    _saved(tmp_path / "short.parquet", 4.0)
    _saved(tmp_path / "long.parquet", 16.0)
    (short, short_peak), (long, long_peak) = (_peak_while_sending(tmp_path / f"{name}.parquet")
                                              for name in ("short", "long"))
    assert long > 3.5 * short and long_peak < short_peak + 2 * 2**20
    whole = load_schedule(tmp_path / "short.parquet")
    assert list(open_saved_schedule(tmp_path / "short.parquet").requests()) == list(whole.requests())
    assert open_saved_schedule(tmp_path / "short.parquet").content_hash == whole.content_hash


def test_a_saved_schedule_changed_after_it_was_saved_fails_its_check_before_anything_is_sent(tmp_path):
    _saved(tmp_path / "s.parquet", 1.0)
    table = pq.read_table(tmp_path / "s.parquet")
    offsets = table.column("arrival_offset_s").to_numpy().copy()
    offsets[3] += 0.5
    changed = table.set_column(table.schema.get_field_index("arrival_offset_s"), "arrival_offset_s", [offsets])
    pq.write_table(changed, tmp_path / "s.parquet")  # its footer keeps the stored hash
    with pytest.raises(DatasetError, match="fails its integrity check"):
        open_saved_schedule(tmp_path / "s.parquet")


def test_a_sender_to_a_collector_that_reads_nothing_waits_instead_of_queueing_without_bound():
    """The collector's link holds at most RECORDS_HWM frames a side: a sender then waits (its send times out
    and tries again while it may) rather than its backlog growing in memory; stopping, it gives up."""
    import zmq

    from batchlab.protocol.sockets import Bundler, make_socket

    ctx = zmq.Context()
    collector = make_socket(ctx, zmq.ROUTER, "inproc://collector", bind=True, hwm=10)
    sender = make_socket(ctx, zmq.DEALER, "inproc://collector", bind=False, identity="w0", hwm=10,
                         send_timeout_ms=50)
    try:
        queued = 0
        for _ in range(1000):
            try:
                sender.send(b"x" * 1000)
                queued += 1
            except zmq.Again:
                break
        assert 0 < queued <= 2 * 10  # both sides' queues full: the rest waits
        tries = []
        records = Bundler(sender, 0.0, keep_trying=lambda: tries.append(1) or len(tries) < 3)
        records.add(RunInfo({"t0": 0.0}))
        records.flush(force=True)  # tried three times, then given up (the process is stopping)
        assert len(tries) == 3 and records.records == [] and records.send_s >= 0.1
    finally:
        sender.close(linger=0)
        collector.close(linger=0)
        ctx.term()
