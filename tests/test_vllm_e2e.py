"""`batchlab run --backend vllm` end to end: traffic → scheduler → vLLM worker → collector on tiny-mistral."""
import json

import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")


def test_vllm_run_gives_every_request_its_exact_tokens(tmp_path):
    out, config = tmp_path / "run", tmp_path / "eager.yaml"
    config.write_text("enforce_eager: true\n")  # skips torch.compile on CPU (tens of seconds)
    run_cli("run", "--config", str(config), "--backend", "vllm", "--strategy", "continuous", "--model",
            "tiny-mistral", "--rate", "4", "--duration", "3", "--out", str(out), timeout_s=600)
    requests = pd.read_parquet(out / "requests.parquet")
    tokens = pd.read_parquet(out / "tokens.parquet")
    assert len(requests) > 0 and (requests.status == "finished").all()
    counts = tokens.groupby("request_id").size().reindex(requests.request_id, fill_value=0)
    assert (counts.to_numpy() == requests.output_len.to_numpy()).all()
    assert (requests.ttft > 0).all() and (requests.tpot > 0).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory_kind"] == "vllm_kv_pool" and summary["peak_memory_bytes"] > 0
    # vLLM's own stamps came with each completion: the first token's time is the engine's
    assert requests.engine_first_token_time.notna().all()
    assert (requests.engine_first_token_time - requests.first_token_time).abs().max() < 1e-6
    assert "request_metrics" not in json.dumps(summary["worker_stats"])
    assert summary["prefix_cache"]["prompt_tokens"] == int(requests.prompt_len.sum())
    # one engine iteration per step: a request's tokens never share a time (ITL 0 was the old symptom)
    for _, g in tokens.sort_values(["request_id", "token_index"]).groupby("request_id"):
        assert g.time.diff().dropna().gt(0).all()
