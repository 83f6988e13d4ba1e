"""Requests forged on loopback without keys: only the traffic that announced the schedule may submit, only
ids its schedule holds, only prompts as long as they say. A forgery is refused and counted; the real
rows stay exact. The gate's rules, the scheduler's handle code on a fake socket, then standalone roles."""
import json
import threading
import time

import numpy as np
import pandas as pd
import pytest
import zmq

from batchlab.protocol import (BatchDone, EndOfStream, ProtocolError, RequestMsg, RunEnd, TrafficHello, decode, encode,
                               now)
from batchlab.protocol.messages import Arrival, pack_tokens
from batchlab.scheduler.policies import make_policy
from batchlab.scheduler.gate import REFUSED_REQUESTS, REFUSED_STREAM, PlannedSchedule, TrafficGate
from batchlab.scheduler.process import Scheduler
from tests.test_faults import COMMON, assert_conserved, finish, free_port, roles, start
from tests.test_wire_values import Capture, FakeRouter

TRAFFIC, FORGER = b"traffic", b"\x00forger"
T0 = 100.0  # the traffic's Start in the gate's tests (scheduler clock, s)


def request(rid: int, prompt_len: int = 4, arrival: float = T0 + 0.5) -> RequestMsg:
    return RequestMsg(rid, arrival, arrival, prompt_len, 4, pack_tokens(range(prompt_len)))


def started_gate(planned: PlannedSchedule | None = None, n_requests: int = 10) -> TrafficGate:
    """A gate whose traffic announced `n_requests` and was told to start at T0."""
    gate = TrafficGate(planned)
    assert gate.refusal(TRAFFIC, TrafficHello(n_requests, "hash", 1.0)) == ""
    gate.start(T0)
    return gate


def test_only_the_announced_traffic_submits_and_only_ids_of_its_schedule():
    gate = TrafficGate()
    assert "before any traffic" in gate.refusal(TRAFFIC, request(0), T0 + 1)
    assert gate.refusal(TRAFFIC, TrafficHello(10, "hash", 1.0)) == ""
    assert "before the traffic was told to start" in gate.refusal(TRAFFIC, request(9), T0 + 1)
    gate.start(T0)
    assert gate.refusal(TRAFFIC, request(9), T0 + 1) == ""
    assert "outside the announced schedule of 10" in gate.refusal(TRAFFIC, request(10), T0 + 1)
    assert "not the traffic" in gate.refusal(FORGER, request(3), T0 + 1)
    assert "a second traffic" in gate.refusal(FORGER, TrafficHello(99, "other", 1.0))
    assert "a second traffic" in gate.refusal(FORGER, EndOfStream(0))
    assert gate.refusal(TRAFFIC, EndOfStream(1)) == ""
    assert gate.traffic == TRAFFIC and gate.n_requests == 10 and gate.received == 1
    assert gate.stats == {REFUSED_REQUESTS: 4, REFUSED_STREAM: 2}


def test_the_traffic_is_bound_for_the_run_a_second_hello_and_anything_after_its_end_are_refused():
    gate = started_gate()
    assert "the traffic again" in gate.refusal(TRAFFIC, TrafficHello(1000, "other", 1.0))
    assert gate.n_requests == 10  # the first hello's schedule stays
    gate.end("the traffic's process ended")  # it died: whoever connects with its routing id now is not it
    assert "after the stream ended (the traffic's process ended)" in gate.refusal(TRAFFIC, request(3), T0 + 1)
    assert "a second EndOfStream" in gate.refusal(TRAFFIC, EndOfStream(0))
    assert gate.received == 0 and gate.stats == {REFUSED_REQUESTS: 1, REFUSED_STREAM: 2}


def test_a_request_is_refused_when_planned_before_the_start_or_not_yet_due():
    gate = started_gate()
    assert "planned 8936.000 s before the traffic's start" in gate.refusal(TRAFFIC, request(1, arrival=T0 - 8936),
                                                                           T0 + 1)
    assert "before its planned time" in gate.refusal(TRAFFIC, request(2, arrival=T0 + 60), T0 + 1)
    assert gate.refusal(TRAFFIC, request(3, arrival=T0 + 1.2), T0 + 1) == ""  # a remote sender's clock error
    assert gate.stats[REFUSED_REQUESTS] == 2


def test_with_the_runs_schedule_a_request_must_match_its_row_and_the_hello_its_hash():
    planned = PlannedSchedule("hash", np.array([0.0, 0.5, 1.0]), np.array([4, 4, 8]), np.array([4, 4, 4]))
    assert "not the run's" in TrafficGate(planned).refusal(TRAFFIC, TrafficHello(3, "other", 1.0))
    gate = started_gate(planned, n_requests=3)
    assert gate.refusal(TRAFFIC, request(1, arrival=T0 + 0.5), T0 + 2) == ""
    assert "its schedule's row says 8 + 4" in gate.refusal(TRAFFIC, request(2, arrival=T0 + 1.0), T0 + 2)
    assert "its schedule says 0.000 s" in gate.refusal(TRAFFIC, request(0, arrival=T0 + 0.3), T0 + 2)
    closed = started_gate(PlannedSchedule("hash", planned.offsets_s, planned.prompt_lens, planned.output_lens,
                                          closed_loop=True), n_requests=3)
    assert closed.refusal(TRAFFIC, request(0, arrival=T0 + 0.3), T0 + 2) == ""  # a client's time: not planned


def test_a_request_whose_frame_holds_more_tokens_than_its_prompt_len_is_refused_by_the_codec():
    oversized = RequestMsg(1, 1.0, 1.0, 4, 4, pack_tokens(range(1_000_000)))  # 4 MB of tokens, "4 tokens"
    with pytest.raises(ProtocolError, match="RequestMsg: inconsistent fields"):
        decode(encode(oversized))
    assert decode(encode(request(1))) == request(1)


def test_the_scheduler_refuses_and_counts_forgeries_and_keeps_each_real_request_once():
    sched = Scheduler(make_policy("naive", batch_size=4), f"tcp://127.0.0.1:{free_port()}",
                      f"tcp://127.0.0.1:{free_port()}")
    real, records = sched.inbox.sock, []
    sched.records.sock = Capture(records)
    forged_oversize = encode(RequestMsg(5, T0, T0, 4, 4, pack_tokens(range(100_000))))
    messages = [[FORGER, encode(request(0))],  # before the traffic announced itself
                [TRAFFIC, encode(TrafficHello(6, "hash", 1.0))],
                [FORGER, encode(request(2, prompt_len=64))],  # takes a real id before the traffic sends it
                [FORGER, encode(TrafficHello(1000, "other", 1.0))],
                [TRAFFIC, forged_oversize],
                [TRAFFIC, encode(request(10 ** 6))],  # outside the schedule
                *[[TRAFFIC, encode(request(i))] for i in range(6)],
                [FORGER, encode(EndOfStream(0))],  # a forged end would stop the stream early
                ]
    sched.gate.start(T0)  # the requests below are due (planned after T0, received now)
    try:
        sched.inbox.sock = FakeRouter(messages)
        for sender, msg in sched.inbox.receive(0):
            sched._handle(sender, msg)
            sched._forward()
        assert not sched.core.eos
        sched.core.end_of_stream()
        sched._finish("test over")
    finally:
        sched.inbox.sock = real
        sched.close()
    arrivals = [r.request for r in records if isinstance(r, Arrival)]
    assert [a.request_id for a in arrivals] == list(range(6)) and {a.prompt_len for a in arrivals} == {4}
    stats = next(r for r in records if isinstance(r, RunEnd)).stats
    assert stats[REFUSED_REQUESTS] == 3 and stats[REFUSED_STREAM] == 2 and stats["rejected_messages"] == 1
    assert stats["duplicate_requests"] == 0 and stats["submitted"] == 6


@pytest.mark.slow
def test_forged_requests_on_loopback_are_refused_counted_and_the_real_rows_stay_exact(tmp_path):
    out = tmp_path / "run"
    oversized = encode(RequestMsg(7, 1.0, 1.0, 4, 4, bytes(60_000_000)))  # 60 MB of tokens claiming 4
    sched, _, procs = roles(out)
    procs["traffic"] = start("traffic", *COMMON[2:], "--rate", "10", "--duration", "6", "--scheduler", sched,
                             "--out", str(out))
    progress, deadline = out / "progress.json", time.monotonic() + 180
    while not (progress.exists() and json.loads(progress.read_text() or "{}").get("arrived", 0) > 0):
        assert time.monotonic() < deadline, "the traffic never started"
        time.sleep(0.05)
    ctx = zmq.Context()
    forger = ctx.socket(zmq.DEALER)
    forger.connect(sched)
    schedule = pd.read_parquet(out / "schedule.parquet")
    late = int(schedule.request_id.max())  # the traffic sends it last, seconds from now
    for frame in (encode(request(10 ** 6)), encode(request(late, prompt_len=64)), oversized):
        forger.send(frame)
    finish(procs)
    forger.close(linger=0)
    ctx.term()
    requests = assert_conserved(out)  # one row per scheduled id: no phantom, none "duplicate"
    assert set(requests.status) == {"finished"}, requests.error.value_counts().to_dict()
    assert (requests.sort_values("request_id").prompt_len.to_numpy() == schedule.prompt_len.to_numpy()).all()
    summary = json.loads((out / "summary.json").read_text())
    stats = summary["scheduler_stats"]
    assert stats[REFUSED_REQUESTS] == 2 and stats["rejected_messages"] == 1 and stats["duplicate_requests"] == 0
    assert "refused messages" in (out / "logs" / "scheduler.log").read_text()


def test_a_takeover_of_the_traffics_routing_id_after_it_died_is_refused_and_counted():
    """A process that connects with the dead traffic's routing id is not believed: its hello is a second one,
    its requests come after the stream's end (the launcher saw the traffic's process end), and those planned
    long before the start would be refused anyway. None becomes a row."""
    from tests.test_worker_robustness import WORKER, Peer, SchedulerRig, is_dispatch
    from tests.test_worker_robustness import request as due_request

    rig, forger = SchedulerRig(), None
    try:
        ended = threading.Event()
        rig.sched.stream_ended = ended  # the launcher's event: set when it sees the traffic's process end
        rig.join()
        rig.traffic.send(due_request(0))
        rig.worker.wait_for(is_dispatch)  # in flight on the (fake) worker: the run goes on
        rig.traffic.sock.close(linger=0)  # the traffic dies
        rig.worker.others = []  # nobody beats for it any more
        ended.set()
        deadline = time.monotonic() + 60
        while not rig.sched.gate.ended:
            assert time.monotonic() < deadline, "the scheduler never saw the stream end"
            rig.worker.read_one()
        forger = Peer(rig.ctx, rig.sched_addr, "traffic")  # its routing id is free again
        forger.send(TrafficHello(10, "hash", 1.0))
        for rid in range(1, 21):
            forger.send(due_request(rid) if rid <= 9 else request(rid, arrival=now() - 8936))
        forger.settled()  # the scheduler handled all of it
        assert rig.sched.gate.stats == {REFUSED_REQUESTS: 20, REFUSED_STREAM: 1}
        rig.worker.send(BatchDone(0, WORKER, now(), now(), [0]))
        end = rig.recorded_until(lambda m: isinstance(m, RunEnd))
    finally:
        if forger is not None:
            forger.sock.close(linger=0)
        rig.close()
    assert [a.request.request_id for a in rig.recorded if isinstance(a, Arrival)] == [0]
    assert end.submitted == 1 and end.stats[REFUSED_REQUESTS] == 20 and end.stats[REFUSED_STREAM] == 1
