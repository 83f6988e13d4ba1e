"""The `openai` backend: the token-count rule (pure), then against a real vLLM OpenAI server on loopback."""
import json
import os
import signal
import subprocess
import time

import pytest

from batchlab.worker.backend import BackendRequest
from batchlab.worker.openai_client import base_url
from batchlab.worker.openai_count import OpenAIStreamRequest, count_chunk, settle
from benchmarks.vllm_procs import free_port, kill_group, server_command, wait_healthy

SERVER_START_TIMEOUT_S = 240.0


def _row(output_len: int, request_id: int = 7) -> BackendRequest:
    return BackendRequest.new(request_id, 3, output_len, [1, 2, 3], 0)


def _text_chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text}]}


def _feed(tally: OpenAIStreamRequest, chunks: list[dict]) -> list:
    emitted = [count_chunk(tally, c, float(i)) for i, c in enumerate(chunks)]
    return [c for c in emitted if c is not None] + settle(tally, 99.0)


# --- the counting rule (no server) ----------------------------------------------------------------
def test_token_ids_in_chunks_are_emitted_exactly():
    tally = OpenAIStreamRequest(_row(3))
    out = _feed(tally, [{"choices": [{"text": "a", "token_ids": [5, 6]}]},
                        {"choices": [{"text": "", "token_ids": [9]}]},
                        {"choices": [], "usage": {"completion_tokens": 3}}])
    assert [c.token_ids for c in out if c.token_ids] == [[5, 6], [9]]
    assert out[-1].end == "ok"


def test_continuous_usage_counts_the_increase_per_chunk():
    tally = OpenAIStreamRequest(_row(5))
    out = _feed(tally, [{"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}},
                        {"choices": [{"text": "c"}], "usage": {"completion_tokens": 5}},
                        {"choices": [], "usage": {"completion_tokens": 5}}])
    assert [len(c.token_ids) for c in out if c.token_ids] == [2, 3]
    assert out[-1].end == "ok"


def test_text_chunks_shortfall_goes_to_the_last_chunk():
    tally = OpenAIStreamRequest(_row(6))
    out = _feed(tally, [_text_chunk("a"), _text_chunk(""), _text_chunk("bc"),
                        {"choices": [], "usage": {"completion_tokens": 6}}])
    assert [(c.time, len(c.token_ids)) for c in out] == [(0.0, 1), (2.0, 5)]
    assert out[-1].end == "ok"


def test_text_chunks_excess_is_taken_from_the_latest_chunks():
    tally = OpenAIStreamRequest(_row(2))
    out = _feed(tally, [_text_chunk("a"), _text_chunk("b"), _text_chunk("c"),
                        {"choices": [], "usage": {"completion_tokens": 2}}])
    assert [(c.time, len(c.token_ids)) for c in out] == [(0.0, 1), (1.0, 1)]


def test_a_short_completion_fails_with_the_counts():
    out = _feed(OpenAIStreamRequest(_row(10)), [_text_chunk("a"), {"choices": [], "usage": {"completion_tokens": 4}}])
    assert sum(len(c.token_ids) for c in out) == 4
    assert out[-1].end == "stream error: server returned 4 of 10 tokens"


def test_prefix_cache_counters_are_summed_over_label_sets():
    from batchlab.worker.openai_count import parse_prefix_cache_counters

    text = ('# HELP vllm:prefix_cache_queries_total Prefix cache queries\n'
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 120.0\n'
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 30.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 48.0\n'
            'vllm:prefix_cache_hits_total_created{engine="0"} 1.7e9\n')
    assert parse_prefix_cache_counters(text) == {"queries": 150.0, "hits": 48.0}
    assert parse_prefix_cache_counters("no such metrics\n") == {}


def test_endpoint_base_drops_v1_and_slashes():
    assert base_url("http://h:8000/v1/") == base_url("http://h:8000") == "http://h:8000"


# --- a real vLLM OpenAI server --------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on tiny-mistral, in its own process group."""
    pytest.importorskip("vllm")
    from batchlab.models.folders import resolve_model

    port, log_path = free_port(), tmp_path_factory.mktemp("vllm-server") / "server.log"
    cmd = server_command(resolve_model("tiny-mistral"), port)  # prefix caching on: its counters are tested
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # serves POST /reset_prefix_cache
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, SERVER_START_TIMEOUT_S)
        yield url, proc
    finally:
        kill_group(proc)


def _drain(backend, limit_s: float = 120.0) -> list:
    outs, deadline = [], time.monotonic() + limit_s
    while backend.has_work() and time.monotonic() < deadline:
        out = backend.step()
        if out is not None:
            outs.append(out)
    assert not backend.has_work(), "streams did not end in time"
    return outs


@pytest.mark.vllm
@pytest.mark.slow
def test_openai_streams_exact_token_counts_from_vllm(server):
    from batchlab.worker.openai_client import OpenAIBackend

    backend = OpenAIBackend(f"{server[0]}/v1", "tiny-mistral", max_concurrency=4)
    try:
        backend.warmup()
        rows = [BackendRequest.new(i, 5 + 11 * i, 3 + 5 * i, [100 + j for j in range(5 + 11 * i)], 0) for i in range(6)]
        backend.admit(rows)
        outs = _drain(backend)
    finally:
        backend.close()
    assert sorted(rid for o in outs for rid in o.finished) == [r.request_id for r in rows]
    for row in rows:
        stamps = [t for o in outs for rid, t in zip(o.request_ids, o.times) if rid == row.request_id]
        assert len(stamps) == row.output_len and stamps == sorted(stamps)
    assert all(t >= 0 for o in outs for t in o.token_ids)  # vLLM returns the ids (return_token_ids)


@pytest.mark.vllm
@pytest.mark.slow
def test_batchlab_run_on_the_openai_backend_gets_exact_token_counts(server, tmp_path):
    import pandas as pd

    from tests.conftest import run_cli

    run_cli("run", "--backend", "openai", "--endpoint", f"{server[0]}/v1", "--strategy", "continuous",
            "--rate", "4", "--duration", "3", "--max-new-tokens", "16", "--max-concurrency", "8",
            "--out", str(tmp_path), timeout_s=180)
    requests, tokens = pd.read_parquet(tmp_path / "requests.parquet"), pd.read_parquet(tmp_path / "tokens.parquet")
    assert len(requests) > 3 and set(requests.status) == {"finished"}
    assert (tokens.groupby("request_id").size().reindex(requests.request_id).to_numpy()
            == requests.output_len.to_numpy()).all()
    assert (requests.ttft > 0).all() and (requests.tpot > 0).all()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["settings"]["workers"]["worker-0"]["prefix_cache_reset"] == "reset before the run"
    cache = summary["worker_stats"]["worker-0"]["server_prefix_cache"]
    assert cache["queried_tokens"] >= requests.prompt_len.sum() and 0 <= cache["hit_rate"] <= 1


@pytest.mark.vllm
@pytest.mark.slow
def test_openai_cut_streams_fail_and_finished_ones_stay_finished(server):
    """Runs last: it kills the module's server while long streams run."""
    from batchlab.worker.openai_client import OpenAIBackend

    url, proc = server
    backend = OpenAIBackend(url, "tiny-mistral", max_concurrency=8)
    short, long = [BackendRequest.new(i, 8, 4, list(range(10, 18)), 0) for i in (0, 1)], \
        [BackendRequest.new(i, 8, 4000, list(range(20, 28)), 0) for i in (2, 3, 4)]
    backend.admit(short + long)
    outs, got = [], set()
    try:
        while not ({0, 1} <= {r for o in outs for r in o.finished} and got >= {2, 3, 4}):
            out = backend.step()
            if out is not None:
                outs.append(out)
                got |= set(out.request_ids)
        os.killpg(proc.pid, signal.SIGKILL)  # mid-stream, no grace: the open streams break
        outs += _drain(backend, limit_s=60.0)
    finally:
        backend.close()
    failed = {rid: why for o in outs for rid, why in o.failed}
    assert sorted(rid for o in outs for rid in o.finished) == [0, 1]
    assert sorted(failed) == [2, 3, 4]
    assert all(why.startswith("stream error:") for why in failed.values())
