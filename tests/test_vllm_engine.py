"""The `vllm` backend on the real CPU engine: the session's one engine (tests/conftest.py: TinyLlama's
architecture scaled down, vLLM's dummy loader), so its start is paid once."""
import pandas as pd
import psutil
import pytest

from batchlab.models.archs import kv_bytes_per_token
from batchlab.protocol.clock import now
from batchlab.worker.backend import BackendError, BackendRequest
from tests.conftest import VLLM_KV_POOL_BYTES, scaled_tinyllama_arch

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")

# (prompt_len, output_len) per row: different lengths so rows join and leave at different steps
SHAPES = [(5, 3), (17, 8), (40, 16), (90, 24)]


def rows_of(shapes: list[tuple[int, int]], first_id: int = 0) -> list[BackendRequest]:
    """Rows with distinct prompts of the given lengths."""
    return [BackendRequest.new(first_id + i, p, o, [100 + (7 * i + j) % 500 for j in range(p)], 0)
            for i, (p, o) in enumerate(shapes)]


def drain(backend) -> list:
    """Step until the backend has no work; the non-empty step outputs."""
    outs = []
    while backend.has_work():
        out = backend.step()
        if out is not None:
            outs.append(out)
    return outs


@pytest.fixture
def backend(vllm_backend):
    """The session's engine, idle and with an empty prefix cache for each test."""
    vllm_backend.reset()
    yield vllm_backend
    assert not vllm_backend.has_work()


def test_vllm_rows_get_exactly_their_tokens_with_ordered_times(backend):
    rows = rows_of(SHAPES)
    admitted = now()
    backend.admit(rows)
    outs = drain(backend)
    times = [o.time for o in outs]
    assert times == sorted(times)
    finished = [rid for o in outs for rid in o.finished]
    assert sorted(finished) == [r.request_id for r in rows]
    assert not [f for o in outs for f in o.failed]
    # the steps count the prompts they prefilled (the step model's fit prices them): each row's once
    assert sum(o.prefill_tokens for o in outs) == sum(p for p, _ in SHAPES)
    assert sum(o.joined for o in outs) == len(rows)
    for row in rows:
        stamps = [o.time for o in outs for rid in o.request_ids if rid == row.request_id]
        ids = [t for o in outs for rid, t in zip(o.request_ids, o.token_ids) if rid == row.request_id]
        assert len(stamps) == row.output_len
        assert all(0 <= t < 32000 for t in ids)
        ttft_s, tpot_s = stamps[0] - admitted, (stamps[-1] - stamps[0]) / (row.output_len - 1)
        assert ttft_s > 0 and tpot_s > 0


def test_vllm_reports_its_kv_pool_and_usage(backend):
    backend.admit(rows_of([(60, 10), (120, 10)], first_id=100))
    drain(backend)
    info = backend.info
    assert info.memory_kind == "vllm_kv_pool"
    assert info.kv_budget_bytes == info.facts["kv_pool_bytes"]
    # 2 (K, V) × layers × KV heads × head dim × bytes of the engine's dtype
    dtype_bytes = backend.engine.vllm_config.model_config.dtype.itemsize
    assert info.kv_bytes_per_token == kv_bytes_per_token(scaled_tinyllama_arch(), dtype_bytes) == 2 * 2 * 1 * 64 * dtype_bytes
    assert info.facts["kv_pool_tokens"] * info.kv_bytes_per_token == info.kv_budget_bytes
    assert abs(info.kv_budget_bytes - VLLM_KV_POOL_BYTES) <= info.facts["kv_block_size_tokens"] * info.kv_bytes_per_token
    assert 0 < backend.peak_memory_bytes() < info.kv_budget_bytes
    assert backend.run_facts()["kv_cache_usage_peak"] > 0


def test_vllm_records_its_own_request_timestamps(backend):
    backend.admit(rows_of([(30, 6)], first_id=200))
    drain(backend)
    m = backend.request_metrics[200]
    assert m["queued_ts"] <= m["scheduled_ts"] <= m["first_token_ts"] <= m["last_token_ts"] <= now()
    assert m["first_token_latency_s"] > 0


def test_vllm_static_batch_runs_every_row_to_its_length(backend):
    rows = rows_of([(8, 5), (33, 12), (64, 2)], first_id=300)
    outs = []
    backend.run_batch(rows, outs.append)
    counts = pd.Series([rid for o in outs for rid in o.request_ids]).value_counts().to_dict()
    assert counts == {r.request_id: r.output_len for r in rows}


def test_vllm_too_long_prompt_fails_the_row_not_the_engine(backend):
    too_long = backend.engine.vllm_config.model_config.max_model_len + 1
    backend.admit(rows_of([(too_long, 4), (10, 4)], first_id=400))
    outs = drain(backend)
    assert [rid for o in outs for rid, _ in o.failed] == [400]
    assert [rid for o in outs for rid in o.finished] == [401]
    with pytest.raises(BackendError):
        backend.run_batch(rows_of([(too_long, 4)], first_id=410), lambda _o: None)


def _engine_children() -> list[psutil.Process]:
    """Our child processes, less multiprocessing's resource tracker (it lives as long as this process)."""
    return [p for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


def test_vllm_engine_core_runs_in_the_workers_own_process(backend):
    assert not _engine_children(), "in-process engine core: no EngineCore or model worker process"
    assert backend.info.facts["engine_core"].startswith("in-process")


def test_vllm_reset_empties_the_prefix_cache_between_runs(backend):
    block = backend.info.facts["kv_block_size_tokens"]  # only whole blocks are cached
    prompt = [300 + (11 * j) % 400 for j in range(2 * block + 8)]

    def cached_after_run(rid: int) -> int:
        backend.run_batch([BackendRequest.new(rid, len(prompt), 4, prompt, 0)], lambda _out: None)
        return backend.request_metrics.pop(rid)["cached_tokens"]

    cached_after_run(900)
    assert cached_after_run(901) >= block  # the same prompt again: served from the cache
    backend.reset()
    assert cached_after_run(902) == 0 and not backend.has_work()
