"""Requests forged on loopback without keys: only the traffic that announced the schedule may submit, only
ids its schedule holds, only prompts as long as they say. A forgery is refused and counted; the real
rows stay exact. The gate's rules, the scheduler's handle code on a fake socket, then standalone roles."""
import json
import time

import pandas as pd
import pytest
import zmq

from batchlab.protocol import EndOfStream, ProtocolError, RequestMsg, RunEnd, TrafficHello, decode, encode
from batchlab.protocol.messages import Arrival, pack_tokens
from batchlab.scheduler.policies import make_policy
from batchlab.scheduler.process import REFUSED_REQUESTS, REFUSED_STREAM, Scheduler, TrafficGate
from tests.test_faults import COMMON, assert_conserved, finish, free_port, roles, start
from tests.test_wire_values import Capture, FakeRouter

TRAFFIC, FORGER = b"traffic", b"\x00forger"


def request(rid: int, prompt_len: int = 4) -> RequestMsg:
    return RequestMsg(rid, 1.0, 1.0, prompt_len, 4, pack_tokens(range(prompt_len)))


def test_only_the_announced_traffic_submits_and_only_ids_of_its_schedule():
    gate = TrafficGate()
    assert "before any traffic" in gate.refusal(TRAFFIC, request(0))
    assert gate.refusal(TRAFFIC, TrafficHello(10, "hash", 1.0)) == ""
    assert gate.refusal(TRAFFIC, request(9)) == ""
    assert "outside the announced schedule of 10" in gate.refusal(TRAFFIC, request(10))
    assert "not the traffic" in gate.refusal(FORGER, request(3))
    assert "a second traffic" in gate.refusal(FORGER, TrafficHello(99, "other", 1.0))
    assert "a second traffic" in gate.refusal(FORGER, EndOfStream(0))
    assert gate.refusal(TRAFFIC, EndOfStream(1)) == ""
    assert gate.traffic == TRAFFIC and gate.n_requests == 10 and gate.received == 1
    assert gate.stats == {REFUSED_REQUESTS: 3, REFUSED_STREAM: 2}


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
    forged_oversize = encode(RequestMsg(5, 1.0, 1.0, 4, 4, pack_tokens(range(100_000))))
    messages = [[FORGER, encode(request(0))],  # before the traffic announced itself
                [TRAFFIC, encode(TrafficHello(6, "hash", 1.0))],
                [FORGER, encode(request(2, prompt_len=64))],  # takes a real id before the traffic sends it
                [FORGER, encode(TrafficHello(1000, "other", 1.0))],
                [TRAFFIC, forged_oversize],
                [TRAFFIC, encode(request(10 ** 6))],  # outside the schedule
                *[[TRAFFIC, encode(request(i))] for i in range(6)],
                [FORGER, encode(EndOfStream(0))],  # a forged end would stop the stream early
                ]
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
