"""`--model NAME:random` on the real backends: the real TinyLlama architecture's figures from its config, and
the same architecture scaled down (tests/conftest.py) run through the hf and vLLM backends with seeded or
dummy weights, no download. (A run of the full 1.1e9 random weights costs minutes on 2 cores and tests
nothing the scaled one does not: the code paths are the architecture's, the sizes are the config's.)"""
import pytest

from batchlab.models.archs import ARCHS, kv_bytes_per_token, n_params
from batchlab.worker.backend import BackendRequest, worker_hello
from tests.conftest import scaled_tinyllama, scaled_tinyllama_arch

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 4
# (prompt_len, output_len): rows of different lengths, so padding and early finishes are exercised
SHAPES = [(9, MAX_NEW_TOKENS), (40, 2), (64, 3)]


def rows() -> list[BackendRequest]:
    return [BackendRequest.new(i, p, o, [100 + (13 * i + j) % 900 for j in range(p)], 0)
            for i, (p, o) in enumerate(SHAPES)]


def assert_exact_lengths(outs, rows_: list[BackendRequest]) -> None:
    """Every row got exactly its output_len tokens, each a token of the 32,000-token vocabulary, and finished once."""
    counts = {}
    for o in outs:
        for rid, tok in zip(o.request_ids, o.token_ids):
            counts[rid] = counts.get(rid, 0) + 1
            assert 0 <= tok < 32000
    assert counts == {r.request_id: r.output_len for r in rows_}
    assert sorted(rid for o in outs for rid in o.finished) == [r.request_id for r in rows_]


def test_tinyllamas_config_gives_its_parameter_count_and_kv_bytes():
    """What the worker reports for `tinyllama-1.1b:random` (its hello's n_params and KV bytes at bf16)."""
    assert n_params(ARCHS["tinyllama-1.1b"]) == 1_100_048_384
    assert kv_bytes_per_token(ARCHS["tinyllama-1.1b"], 2) == 2 * 22 * 4 * 64 * 2


def test_random_tinyllama_runs_on_hf_with_exact_lengths():
    from batchlab.protocol.settings import RunConfig
    from batchlab.worker.hf.static import HFBackend

    with scaled_tinyllama() as model:
        cfg = RunConfig(backend="hf", strategy="dynamic", model=model, device="cpu", dtype="bfloat16")
        backend = HFBackend.from_config(cfg, "static", 4)
        try:
            backend.warmup()
            outs = []
            backend.run_batch(rows(), outs.append)
        finally:
            backend.close()
    assert_exact_lengths(outs, rows())
    facts = worker_hello("worker-0", backend.info).facts
    arch = scaled_tinyllama_arch()
    assert facts["weights"] == "random weights, real architecture" and "not the original's" in facts["tokenizer"]
    assert facts["n_params"] == n_params(arch) and facts["dtype"] == "bfloat16" and facts["load_s"] > 0
    assert backend.info.kv_bytes_per_token == kv_bytes_per_token(arch, 2)


@pytest.mark.vllm
def test_random_tinyllama_runs_on_vllm_with_its_dummy_loader(vllm_backend):
    outs = []
    vllm_backend.run_batch(rows(), outs.append)
    assert_exact_lengths(outs, rows())
    facts = worker_hello("worker-0", vllm_backend.info).facts
    dtype_bytes = vllm_backend.engine.vllm_config.model_config.dtype.itemsize
    assert facts["weights"] == "random weights, real architecture" and facts["load_format"].startswith("dummy")
    assert vllm_backend.info.kv_bytes_per_token == kv_bytes_per_token(scaled_tinyllama_arch(), dtype_bytes)
    assert facts["engine_start_s"] > 0
