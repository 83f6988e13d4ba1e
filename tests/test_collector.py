"""Collector: joining events into tables, metric formulas, crash safety, and the socket loop."""
import json
import os
import signal
import math
import random
import threading
import time

import numpy as np
import pandas as pd
import pytest
import zmq

from batchlab.collector import merge
from batchlab.collector.parts import PartWriter, load_table, write_final
from batchlab.collector.process import finish_run, run_collector
from batchlab.collector.store import RunStore
from batchlab.protocol import (Arrival, BatchDone, BatchLaunch, FailedRow, Heartbeat, RequestFailed, RequestMsg,
                               RunEnd, RunInfo, Step, Tokens, WorkerBye, encode)
from batchlab.protocol.status import FailureReason
from batchlab.stats.metrics import goodput, percentiles, summarize
from tests.wire_cases import launch, tokens

NO_TERMINAL, NOT_SENT = FailureReason.NO_TERMINAL, FailureReason.NOT_SENT

T0 = 1000.0
SETTINGS = {"strategy": "static", "backend": "sim", "model": "m", "rate": 2.0, "arrival": "poisson",
            "seed": 7, "t0": T0}


def arrival(rid: int, offset_s: float, prompt_len: int, output_len: int) -> Arrival:
    return Arrival(RequestMsg(rid, T0 + offset_s, T0 + offset_s + 0.001, prompt_len, output_len), T0 + offset_s + 0.002)


def script() -> list:
    """r1 finishes, r2 fails in its batch, r3 OOMs then finishes, r4 never ends, r5 queue-full."""
    return [
        RunInfo(SETTINGS),
        arrival(1, 0.0, 10, 3), arrival(2, 0.1, 20, 4), arrival(3, 0.2, 5, 2),
        arrival(4, 0.3, 5, 2), arrival(5, 0.4, 5, 2),
        launch(1, "w0", T0 + 0.5, "size", [1, 2], 3),
        tokens(1, 0, T0 + 1.0, [1, 2], [11, 21]),
        tokens(1, 1, T0 + 1.1, [1, 2], [12, 22]),
        tokens(1, 2, T0 + 1.2, [1], [13]),
        BatchDone(1, "w0", T0 + 0.6, T0 + 1.2, [1], [FailedRow(2, "decode error")], False, 500),
        RequestFailed(5, "queue full", T0 + 0.4),
        launch(2, "w0", T0 + 1.3, "age", [3], 1),
        tokens(2, 0, T0 + 1.4, [3], [99]),
        BatchDone(2, "w0", T0 + 1.3, T0 + 1.5, [], [], True, 900),
        Heartbeat("w0", T0 + 1.5),
        launch(3, "w0", T0 + 1.6, "memory", [3], 1),
        tokens(3, 0, T0 + 2.0, [3, 3], [31, 32]),  # two tokens of r3 in one message
        BatchDone(3, "w0", T0 + 1.7, T0 + 2.0, [3], [], False, 700),
        RunEnd(5, ["w0"], {"launched": 3}),
        WorkerBye("w0", 1000, "cpu_peak_rss", {"batches": 3}),
    ]


def run_store(messages: list) -> RunStore:
    store = RunStore()
    for msg in messages:
        store.handle(msg)
    return store


def by_id(df: pd.DataFrame) -> dict:
    return {int(r["request_id"]): r for r in df.to_dict("records")}


def test_scripted_run_measures_latency_from_planned_arrival():
    req = by_id(run_store(script()).finish().requests)
    r1 = req[1]
    assert (r1["status"], r1["error"], r1["worker"], r1["batch_id"]) == ("finished", "", "w0", 1)
    assert r1["arrival_time"] == pytest.approx(0.0)
    assert r1["queue_wait"] == pytest.approx(0.5)
    assert r1["ttft"] == pytest.approx(1.0)
    assert r1["tpot"] == pytest.approx(0.1)  # (1.2 - 1.0) / (3 - 1)
    assert r1["e2e"] == pytest.approx(1.2)
    assert r1["ttft"] >= r1["queue_wait"] >= 0
    assert (r1["n_tokens"], r1["strategy"], r1["seed"]) == (3, "static", 7)


def test_failures_are_kept_with_their_reasons():
    req = by_id(run_store(script()).finish().requests)
    assert (req[2]["status"], req[2]["error"]) == ("failed", "decode error")
    assert (req[5]["status"], req[5]["error"]) == ("failed", "queue full")
    assert math.isnan(req[2]["completion_time"])


def test_request_without_terminal_record_fails_with_reason():
    req = by_id(run_store(script()).finish().requests)
    assert (req[4]["status"], req[4]["error"]) == ("failed", NO_TERMINAL)


def test_oom_batch_tokens_are_discarded_and_retry_counts():
    tables = run_store(script()).finish()
    r3 = by_id(tables.requests)[3]
    assert (r3["status"], r3["attempts"], r3["batch_id"], r3["n_tokens"]) == ("finished", 2, 3, 2)
    tok = tables.tokens[tables.tokens["request_id"] == 3]
    assert tok["token_id"].tolist() == [31, 32]
    assert tok["token_index"].tolist() == [0, 1]
    assert 99 not in tables.tokens["token_id"].tolist()
    assert by_id(tables.batches.rename(columns={"batch_id": "request_id"}))[2]["oom"]


def test_finished_requests_have_exactly_output_len_tokens():
    tables = run_store(script()).finish()
    finished = tables.requests[tables.requests["status"] == "finished"]
    counts = tables.tokens.groupby("request_id").size()
    for rec in finished.to_dict("records"):
        assert counts[rec["request_id"]] == rec["output_len"]


def test_batches_table_has_useful_fraction_and_times():
    batches = by_id(run_store(script()).finish().batches.rename(columns={"batch_id": "request_id"}))
    b1 = batches[1]
    assert b1["useful_fraction"] == pytest.approx(7 / (2 * 4))  # outputs 3 and 4
    assert (b1["size"], b1["launch_reason"], b1["max_prompt_len"], b1["max_output_len"]) == (2, "size", 20, 4)
    assert (b1["scheduled_time"], b1["completion_time"]) == (pytest.approx(0.5), pytest.approx(1.2))
    assert not b1["oom"] and b1["queue_len"] == 3


def test_schedule_rows_never_sent_become_failed():
    schedule = pd.DataFrame({"request_id": [1, 2, 3, 4, 5, 6], "arrival_offset_s": [0, .1, .2, .3, .4, 5.0],
                             "prompt_len": [10, 20, 5, 5, 5, 8], "output_len": [3, 4, 2, 2, 2, 9]})
    tables = run_store(script()).finish(schedule)
    r6 = by_id(tables.requests)[6]
    assert (r6["status"], r6["error"], r6["arrival_time"], r6["output_len"]) == ("failed", NOT_SENT, 5.0, 9)
    assert (tables.summary.scheduled, tables.summary.submitted) == (6, 5)


def test_summary_counts_window_and_throughput():
    summary = run_store(script()).finish().summary
    assert (summary.finished, summary.failed) == (2, 3)
    assert summary.failure_reasons == {"decode error": 1, "queue full": 1, NO_TERMINAL: 1}
    assert summary.window_s == pytest.approx(2.0)  # first arrival 0 → r3's last token at 2.0
    assert summary.throughput_tok_s == pytest.approx(5 / 2.0)
    assert (summary.peak_memory_bytes, summary.memory_kind) == (1000, "cpu_peak_rss")
    assert summary.scheduler_stats == {"launched": 3} and summary.worker_stats == {"w0": {"batches": 3}}


def test_summary_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    values = rng.exponential(size=101)
    stats = percentiles(pd.Series(values))
    assert stats["mean"] == pytest.approx(values.mean())
    for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert stats[key] == pytest.approx(np.percentile(values, q))


def test_itl_is_consecutive_token_gaps_within_a_request():
    tables = run_store(script()).finish()
    itl = summarize(tables.requests, tables.tokens, SETTINGS)["itl"]
    gaps = [0.1, 0.1, 0.0]  # r1: 1.0→1.1→1.2; r3: two tokens at 2.0
    assert itl["mean"] == pytest.approx(np.mean(gaps))
    assert itl["p50"] == pytest.approx(np.percentile(gaps, 50))


def test_goodput_counts_failures_as_misses():
    requests = run_store(script()).finish().requests
    result = goodput(requests, {"ttft": 5.0})
    assert (result["met"], result["submitted"]) == (2, 5)  # 3 failed requests are misses
    assert result["fraction"] == pytest.approx(0.4)
    assert goodput(requests, {"ttft": 1.5})["met"] == 1  # r3's ttft is 1.8


def test_first_terminal_record_wins():
    store = run_store(script() + [BatchDone(9, "w0", T0 + 3, T0 + 3, [5], [], False, 0)])
    assert by_id(store.finish().requests)[5]["status"] == "failed"
    assert store.counters["duplicate_terminals"] == 1


def test_steps_table_only_when_steps_arrived():
    assert run_store(script()).finish().steps is None
    steps = run_store(script() + [Step("w0", 4, T0 + 1.0, T0 + 1.1, 3, 1, 0, 96, 2, 64, 5120)]).finish().steps
    assert steps.to_dict("records") == [{"worker": "w0", "step": 4, "start_time": pytest.approx(1.0),
                                         "end_time": pytest.approx(1.1), "running": 3, "joined": 1,
                                         "finished": 0, "prefill_tokens": 96, "prefill_rows": 2,
                                         "prefill_width": 64, "prefill_pairs": 5120}]


def test_killed_run_is_readable_through_load_table(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    msgs = script()
    for msg in msgs[:11]:  # up to r1's BatchDone and r5's failure
        store.handle(msg)
    writer.write(store.take_parts())
    for msg in msgs[11:]:
        store.handle(msg)
    writer.write(store.take_parts())  # then the process dies: no finish, no final files
    requests = load_table(tmp_path, "requests")
    assert sorted(requests["request_id"]) == [1, 2, 3, 5]
    assert len(load_table(tmp_path, "tokens")) == 3 + 2 + 2  # r1, r2's partial, r3's counting attempt
    assert sorted(load_table(tmp_path, "batches")["batch_id"]) == [1, 2, 3]


def serve(tmp_path, **kwargs) -> tuple[str, threading.Thread, list]:
    address = f"ipc://{tmp_path}/c.sock"
    result: list = []
    thread = threading.Thread(target=lambda: result.append(run_collector(address, tmp_path, **kwargs)))
    thread.start()
    return address, thread, result


def push_all(address: str, frames: list[bytes]) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)  # as a role's: the collector is a ROUTER
    sock.setsockopt(zmq.LINGER, 30_000)  # a collector that binds late under load still gets every frame
    sock.connect(address)
    for frame in frames:
        sock.send(frame)
    sock.close()
    ctx.term()


def test_collector_over_socket_ends_on_run_end_and_byes_and_writes_files(tmp_path):
    address, thread, result = serve(tmp_path, grace_s=30.0, slos={"ttft": 5.0})
    push_all(address, [encode(m) for m in script()])
    thread.join(timeout=20)
    assert not thread.is_alive()
    summary = result[0]
    assert summary.end_reason == "run end and every worker's bye"
    for name in ("requests", "tokens", "batches"):
        assert (tmp_path / f"{name}.parquet").exists()
    assert not (tmp_path / "steps.parquet").exists() and not (tmp_path / ".parts").exists()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["finished"] == 2 and on_disk["goodput"]["met"] == 2
    assert len(pd.read_parquet(tmp_path / "requests.parquet")) == 5


def test_malformed_frame_is_counted_and_collector_keeps_going(tmp_path):
    address, thread, result = serve(tmp_path, grace_s=30.0)
    frames = [encode(m) for m in script()]
    push_all(address, [b"\xc1garbage", frames[0], b"", *frames[1:]])
    thread.join(timeout=20)
    assert result[0].rejected_messages == 2
    assert result[0].finished == 2


def test_idle_timeout_ends_run_and_fails_unfinished(tmp_path):
    address, thread, result = serve(tmp_path, idle_timeout_s=0.5)
    push_all(address, [encode(m) for m in script()[:6]])  # arrivals only, no RunEnd
    thread.join(timeout=20)
    summary = result[0]
    assert summary.end_reason == "idle timeout"
    assert summary.failure_reasons == {NO_TERMINAL: 5}


def test_sigterm_stops_loop_and_writes_what_is_known(tmp_path):
    address = f"ipc://{tmp_path}/c.sock"
    pusher = threading.Thread(target=push_all, args=(address, [encode(m) for m in script()[:6]]))

    def kill_once_pushed() -> None:  # not on a fixed timer: a loaded machine may not have sent them yet
        pusher.join()
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=kill_once_pushed)
    pusher.start()
    killer.start()
    summary = run_collector(address, tmp_path)  # main thread: its handlers are installed here
    pusher.join()
    assert summary.end_reason.startswith("signal")
    assert load_table(tmp_path, "requests")["error"].tolist() == [NO_TERMINAL] * 5
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored


def test_unsent_rows_come_from_traffic_schedule_file(tmp_path):
    schedule = pd.DataFrame({"request_id": [1, 2, 3, 4, 5, 6, 7],
                             "arrival_offset_s": [0, .1, .2, .3, .4, 5.0, 6.0],
                             "prompt_len": [10, 20, 5, 5, 5, 8, 8], "output_len": [3, 4, 2, 2, 2, 9, 9],
                             "prompt_tokens": [[1, 2]] * 7})
    schedule.to_parquet(tmp_path / "schedule.parquet")
    address, thread, result = serve(tmp_path, grace_s=30.0)
    push_all(address, [encode(m) for m in script()])
    thread.join(timeout=20)
    requests = load_table(tmp_path, "requests")
    unsent = requests[requests["error"] == NOT_SENT]
    assert unsent["request_id"].tolist() == [6, 7] and unsent["arrival_time"].tolist() == [5.0, 6.0]
    assert (result[0].scheduled, result[0].submitted) == (7, 5)


def test_tokens_with_mismatched_lengths_are_rejected_not_joined():
    store = run_store(script()[:7] + [Tokens(0, T0 + 1.0, [1, 2], [1, 1], [11])])
    assert store.counters["rejected_messages"] == 1
    assert (1, 1) not in store.tokens


def test_engine_stamps_become_time_columns_since_t0():
    messages = script()
    done = messages.index(next(m for m in messages if isinstance(m, BatchDone) and m.batch_id == 3))
    messages[done] = BatchDone(3, "w0", T0 + 1.7, T0 + 2.0, [3], [], False, 700,
                               {"3": {"first_token_ts": T0 + 1.9, "cached_tokens": 4}})
    requests = run_store(messages).finish().requests
    r3 = by_id(requests)[3]
    assert r3["engine_first_token_time"] == pytest.approx(1.9) and r3["engine_cached_tokens"] == 4
    assert not any(c.endswith("_ts") for c in requests.columns)


def test_percentiles_give_the_statistics_asked_for_in_order():
    stats = percentiles(pd.Series([-3.0, 1.0, 2.0, np.nan]), ("p50", "max_abs", "mean"))
    assert list(stats) == ["p50", "max_abs", "mean"]
    assert stats == {"p50": 1.0, "max_abs": 3.0, "mean": 0.0}
    assert percentiles(pd.Series([], dtype="float64"), ("mean", "p99")) == {"mean": None, "p99": None}


def test_unsent_rows_read_the_schedules_own_offset_column():
    from batchlab.collector.request import SCHEDULE_OFFSET_COLUMN
    from batchlab.traffic.schedule import COLUMNS

    assert SCHEDULE_OFFSET_COLUMN in COLUMNS


def interleaved_run(n: int, seed: int, *, late: bool = True, first: int = 0) -> list:
    """n continuous requests (ids from `first`) whose events interleave at random (so they end out of
    id order): most finish, every 5th fails, every 7th never ends, every 9th gets a token after its
    terminal record (unless not `late`), every 4th carries an engine's own figures."""
    rng = random.Random(seed)
    streams = []
    for rid in range(first, first + n):
        out_len, t = 1 + rid % 6, T0 + 0.01 * rid
        events = [arrival(rid, 0.01 * rid, 3, out_len), launch(100 + rid, "w0", t + 0.1, "credit", [rid], 0)]
        events += [tokens(100 + rid, i, t + 0.2 + 0.01 * i * (1 + rid % 3), [rid], [10 * rid + i])
                   for i in range(out_len)]
        if rid % 7 != 3:
            failed = [FailedRow(rid, "decode error")] if rid % 5 == 1 else []
            engine = {str(rid): {"first_token_ts": t + 0.2, "cached_tokens": rid % 3}} if rid % 4 == 0 else {}
            events.append(BatchDone(100 + rid, "w0", t + 0.1, t + 0.3, [] if failed else [rid], failed, False,
                                    rid, engine))
        if late and rid % 9 == 2:
            events.append(tokens(100 + rid, out_len, t + 0.5, [rid], [7]))
        streams.append(events)
    messages = [RunInfo(SETTINGS)]
    while streams:
        stream = rng.choice(streams)
        messages.append(stream.pop(0))
        if rng.random() < 0.2:
            messages.append(Step("w0", len(messages), T0 + 0.001 * len(messages), T0 + 0.002 * len(messages), 1, 0, 0))
        streams = [s for s in streams if s]
    older = {"request_metrics": {str(first + 3): {"queued_ts": T0 + 0.05}}}  # an older worker: in its bye
    return messages + [RunEnd(n, ["w0"], {}), WorkerBye("w0", 0, "cpu_peak_rss", older)]


def unsent_schedule(n: int) -> pd.DataFrame:
    """A schedule of requests 0..n+4: the last five were never sent."""
    return pd.DataFrame({"request_id": range(n + 5), "arrival_offset_s": [0.01 * i for i in range(n + 5)],
                         "prompt_len": [3] * (n + 5), "output_len": [2] * (n + 5)})


@pytest.mark.slow
@pytest.mark.parametrize("keep_takes, extra", [(1000, "late tokens and anomalies"), (0, ""), (3, "")])
def test_tables_merged_from_parts_equal_the_tables_built_in_memory(tmp_path, monkeypatch, keep_takes, extra):
    monkeypatch.setattr(merge, "TOKEN_CHUNK_ROWS", 7)  # many request-id slices
    monkeypatch.setattr(merge, "REQUEST_CHUNK_ROWS", 5)
    monkeypatch.setattr("batchlab.collector.store.KEEP_TAKES", keep_takes)  # 0: a request leaves at once
    # with `extra`, the script's requests 1-5 too (OOM, queue full, several tokens in one message)
    messages = interleaved_run(60, seed=3, late=bool(extra), first=10) + (script()[1:] if extra else [])
    schedule, slos = unsent_schedule(70), {"ttft": 1.0}
    schedule.to_parquet(tmp_path / "schedule.parquet")
    in_memory = run_store(messages).finish(schedule, slos=slos)
    store, writer = RunStore(), PartWriter(tmp_path)
    for i, msg in enumerate(messages):
        store.handle(msg)
        if i % 13 == 0:
            writer.write(store.take_parts())
    streamed = finish_run(store, writer, tmp_path, slos)
    assert (streamed.requests, streamed.tokens, streamed.batches, streamed.steps) == (None, None, None, None)
    write_final(tmp_path, streamed)
    (tmp_path / "in_memory").mkdir()
    write_final(tmp_path / "in_memory", in_memory)  # both with the run's identity columns, added at the write
    for name in ("requests", "tokens", "batches", "steps"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"),
                                      pd.read_parquet(tmp_path / "in_memory" / f"{name}.parquet"))
    assert streamed.summary == in_memory.summary
    assert streamed.summary.itl.p50 is not None and streamed.summary.prefix_cache
    assert "engine_first_token_time" in in_memory.requests
    assert extra or in_memory.requests.engine_queued_time.notna().sum() == 1  # (the script replaces the bye)
    assert (in_memory.requests.error == NOT_SENT).sum() == 5 + (5 if extra else 10)  # ids 70-74 and below 10


def test_ended_requests_leave_memory_and_their_late_events_are_counted(tmp_path, monkeypatch):
    monkeypatch.setattr("batchlab.collector.store.KEEP_TAKES", 0)
    store, writer = RunStore(), PartWriter(tmp_path)
    for msg in script():
        store.handle(msg)
    writer.write(store.take_parts())
    assert sorted(store.requests) == [4]  # only the request that never ended is in memory
    assert not store.launches and not store.dones and not store.batch_refs  # every batch is written
    store.handle(tokens(1, 3, T0 + 1.3, [1], [14]))
    store.handle(tokens(3, 0, T0 + 1.3, [3], [15]))
    store.handle(RequestFailed(2, "late", T0 + 1.4))
    assert (store.counters["ignored_tokens"], store.counters["duplicate_terminals"]) == (2, 1)
    assert sorted(store.requests) == [4] and not store.tokens
    assert 1 in store.ended and 4 not in store.ended


def test_taken_requests_keep_no_tokens_in_memory(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    for msg in interleaved_run(30, seed=1):
        store.handle(msg)
    writer.write(store.take_parts())
    held = {rid for rid, _ in store.tokens}
    assert held and all(rid % 7 == 3 for rid in held)  # only requests without a terminal record
    assert not store.steps and store.steps_taken > 0
    assert sum(len(load_table(tmp_path, "tokens").query("request_id == @r")) for r in held) == 0


def test_a_token_after_the_terminal_record_goes_to_the_next_part(tmp_path):
    store, writer = RunStore(), PartWriter(tmp_path)
    for msg in script():
        store.handle(msg)
    writer.write(store.take_parts())
    store.handle(tokens(1, 3, T0 + 1.3, [1], [14]))
    assert store.tokens[(1, 1)] == [(T0 + 1.3, 14)]
    writer.write(store.take_parts())
    table = load_table(tmp_path, "tokens").query("request_id == 1")
    assert table["token_index"].tolist() == [0, 1, 2, 3] and (1, 1) not in store.tokens
    r1 = load_table(tmp_path, "requests").query("request_id == 1")  # its row was written again
    assert r1["n_tokens"].tolist() == [4] and r1["completion_time"].tolist() == [pytest.approx(1.3)]


def test_summary_reports_the_harness_cpu_per_request(tmp_path):
    messages = script()
    messages[-2] = RunEnd(5, ["w0"], {"launched": 3, "cpu_s": 0.5})
    messages[-1] = WorkerBye("w0", 1000, "cpu_peak_rss", {"batches": 3, "cpu_s": 0.25})
    address, thread, result = serve(tmp_path, grace_s=30.0)
    push_all(address, [encode(m) for m in messages])
    thread.join(timeout=20)
    cpu = result[0].harness_cpu
    assert cpu["requests"] == 5 and cpu["cpu_s"]["collector"] > 0
    assert (cpu["cpu_s"]["scheduler"], cpu["cpu_s"]["w0"]) == (0.5, 0.25)
    assert cpu["us_per_request"]["scheduler"] == pytest.approx(1e5)
    assert cpu["total_us_per_request"] == pytest.approx(1e6 * sum(cpu["cpu_s"].values()) / 5)


def test_a_token_is_filed_under_the_batch_its_worker_stated_not_the_requests_latest_launch():
    store = run_store([RunInfo(SETTINGS), arrival(1, 0.0, 4, 2), launch(10, "a", T0 + 0.1, "credit", [1]),
                       launch(11, "b", T0 + 0.2, "credit", [1]),  # requeued after a's loss, run on b
                       tokens(10, 0, T0 + 0.3, [1], [7]),  # a late token of a's attempt
                       tokens(11, 0, T0 + 0.4, [1], [8]), tokens(11, 1, T0 + 0.5, [1], [9]),
                       BatchDone(11, "b", T0 + 0.2, T0 + 0.5, [1])])
    assert store.tokens[(1, 10)] == [(T0 + 0.3, 7)] and store.tokens[(1, 11)] == [(T0 + 0.4, 8), (T0 + 0.5, 9)]
    (r1,) = store.finish().requests.to_dict("records")
    assert (r1["batch_id"], r1["n_tokens"], r1["worker"]) == (11, 2, "b")
    assert r1["ttft"] == pytest.approx(0.4)  # from b's first token, not a's


def test_one_launch_of_several_batches_gives_each_batch_its_own_row():
    messages = [RunInfo(SETTINGS), arrival(1, 0.0, 4, 1), arrival(2, 0.0, 4, 1),
                BatchLaunch("w0", T0 + 0.1, "credit", [1, 2], [5, 6], 0),
                Tokens(0, T0 + 0.2, [1, 2], [5, 6], [7, 8]),
                BatchDone(5, "w0", T0 + 0.1, T0 + 0.2, [1]), BatchDone(6, "w0", T0 + 0.1, T0 + 0.2, [2])]
    tables = run_store(messages).finish()
    assert tables.batches[["batch_id", "size"]].values.tolist() == [[5, 1], [6, 1]]
    assert by_id(tables.requests)[2]["batch_id"] == 6 and by_id(tables.requests)[2]["n_tokens"] == 1
