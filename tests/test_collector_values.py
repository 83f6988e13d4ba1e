"""The collector under value-level fuzzing: a run's records with bad frames (every message type's fields
with wrong types and extreme numbers) and colliding ids mixed in, fed to its receive-and-record code
(collector.process._drain, through the protocol's Inbox) on a fake socket. Each bad frame is refused and counted, each colliding id
too, the final write succeeds, and every request keeps exactly one terminal row. Also: any record that
decodes leaves a final write that succeeds."""
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchlab.collector.parts import PartWriter, write_final
from batchlab.collector.process import _drain, finish_run
from batchlab.collector.store import RunStore
from batchlab.protocol import (Arrival, BatchDone, BatchLaunch, FailedRow, RequestFailed, RequestMsg, RunEnd, RunInfo,
                               Step, Tokens, WorkerBye, encode)
from batchlab.protocol.inbox import Inbox
from tests.wire_cases import bad_frame, launch, tokens

EXAMPLES = int(os.environ.get("BATCHLAB_FUZZ_EXAMPLES", 25))  # more for a deeper search by hand
FUZZ = settings(max_examples=EXAMPLES, database=None, deadline=None, suppress_health_check=list(HealthCheck))
N_REQUESTS, OUTPUT_LEN = 6, 2


class Frames:
    """The collector socket's queue: recv gives each frame, then zmq.Again; what the collector answers
    (acknowledgements, heartbeats) is kept in `sent`."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames, self.sent = list(frames), []

    def send(self, frame: bytes, _flags: int = 0) -> None:
        self.sent.append(frame)

    def recv(self, _flags: int = 0) -> bytes:
        if not self.frames:
            raise zmq.Again()
        return self.frames.pop(0)


def run_records() -> list[object]:
    """A small run: six requests, 0-4 finish in one batch with two tokens each, 5 fails at the queue."""
    ids = list(range(N_REQUESTS - 1))
    out = [RunInfo({"t0": 100.0, "strategy": "naive", "backend": "sim"})]
    out += [Arrival(RequestMsg(i, 100.0 + i, 100.0 + i, 4, OUTPUT_LEN), 100.5 + i) for i in range(N_REQUESTS)]
    out += [launch(0, "w0", 106.0, "full", ids, 0), RequestFailed(N_REQUESTS - 1, "queue full", 106.0)]
    out += [tokens(0, s, 107.0 + s, ids, [9] * len(ids)) for s in range(OUTPUT_LEN)]
    out += [BatchDone(0, "w0", 106.5, 109.0, ids, [], False, 10), RunEnd(N_REQUESTS, ["w0"], {}),
            WorkerBye("w0", 10, "none", {})]
    return out


def collect(frames: list[bytes]) -> tuple[RunStore, pd.DataFrame, dict]:
    """The collector's handling of `frames`, then its final write; (store, requests table, summary)."""
    out = Path(tempfile.mkdtemp(prefix="batchlab-test-"))
    try:
        store, writer = RunStore(), PartWriter(out)
        _drain(Inbox(Frames(frames), logging.getLogger(__name__), peer="roles", counters=store.counters), store)
        write_final(out, finish_run(store, writer, out, None))
        return store, pd.read_parquet(out / "requests.parquet"), json.loads((out / "summary.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)


collisions = st.sampled_from([
    Arrival(RequestMsg(1, 0.0, 0.0, 128, 128), 0.0),  # a second Arrival of a live id: refused, never merged
    RequestFailed(2, "bogus", 108.0),  # a second end of a finished id: counted, the first end stays
])


@pytest.mark.slow
@FUZZ
@given(st.lists(st.tuples(st.integers(0, 100), st.one_of(bad_frame, collisions)), max_size=12))
def test_bad_frames_and_colliding_ids_are_counted_and_the_run_is_still_written_whole(inserts):
    frames = [encode(m) for m in run_records()]
    for at, item in sorted(inserts, key=lambda x: -x[0]):  # a collision comes after the real record
        at = min(at, len(frames)) if isinstance(item, bytes) else len(frames) - 2 + at % 3
        frames.insert(at, item if isinstance(item, bytes) else encode(item))
    store, requests, summary = collect(frames)
    bad = sum(isinstance(item, bytes) for _, item in inserts)
    arrivals = sum(isinstance(item, Arrival) for _, item in inserts)
    ends = sum(isinstance(item, RequestFailed) for _, item in inserts)
    assert store.counters["rejected_messages"] == bad + arrivals
    assert store.counters["duplicate_terminals"] == ends
    assert sorted(requests.request_id) == list(range(N_REQUESTS))
    assert requests.set_index("request_id").loc[1, "prompt_len"] == 4  # the colliding Arrival was not merged
    finished = requests[requests.status == "finished"]
    assert sorted(finished.request_id) == list(range(N_REQUESTS - 1))
    assert (finished.n_tokens == OUTPUT_LEN).all()
    assert requests.set_index("request_id").loc[N_REQUESTS - 1, "error"] == "queue full"
    assert summary["finished"] == N_REQUESTS - 1 and summary["rejected_messages"] == bad + arrivals


ints = st.integers(0, 2**63 - 1)
times = st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False)
short = st.text(max_size=6)
setting_names = st.one_of(short, st.sampled_from(["strategy", "backend", "model", "rate", "arrival", "seed"]))
settings_values = st.dictionaries(setting_names, st.one_of(st.none(), ints, times, short, st.binary(max_size=4),
                                                   st.lists(ints, max_size=2)), max_size=4)
records = st.one_of(
    st.builds(Arrival, st.builds(RequestMsg, ints, times, times, st.integers(1, 2**63 - 1),
                                 st.integers(1, 2**63 - 1)), times),
    st.builds(RequestFailed, ints, short, times),
    st.builds(lambda w, t, r, pairs, q: BatchLaunch(w, t, r, [p[0] for p in pairs], [p[1] for p in pairs], q),
              short, times, short, st.lists(st.tuples(ints, ints), max_size=3), ints),
    st.builds(lambda s, t, pairs: Tokens(s, t, [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]),
              ints, times, st.lists(st.tuples(ints, ints, ints), min_size=1, max_size=2)),
    st.builds(BatchDone, ints, short, times, times, st.lists(ints, max_size=2),
              st.lists(st.builds(FailedRow, ints, short), max_size=2), st.booleans(), ints),
    st.builds(Step, short, ints, times, times, ints, ints, ints, ints),
    st.builds(lambda s, t0: RunInfo({**s, "t0": t0}), settings_values, times),
    st.builds(WorkerBye, short, ints, short, settings_values),
)


@pytest.mark.slow
@FUZZ
@given(st.lists(records, max_size=10))
def test_any_records_that_decode_leave_a_final_write_that_succeeds(msgs):
    frames = [encode(m) for m in msgs]
    store, requests, summary = collect(frames)
    assert "submitted" in summary and len(requests) == requests.request_id.nunique()
    assert all(not isinstance(v, float) or math.isfinite(v) for v in summary.values())
