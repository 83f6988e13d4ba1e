"""`--model tinyllama-1.1b:random` end to end on CPU: the real TinyLlama architecture, seeded weights, no download."""
import json

import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow
SMALL_RUN = ("--model", "tinyllama-1.1b:random", "--dtype", "bfloat16", "--rate", "1", "--duration", "2",
             "--max-new-tokens", "4", "--max-prompt-len", "64", "--seed", "3")


def assert_exact_lengths(out) -> dict:
    """Every request finished with exactly its target tokens; returns the first worker's facts."""
    requests, tokens = pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "tokens.parquet")
    assert len(requests) > 0 and (requests.status == "finished").all()
    counts = tokens.groupby("request_id").size().reindex(requests.request_id, fill_value=0)
    assert (counts.to_numpy() == requests.output_len.to_numpy()).all()
    workers = json.loads((out / "summary.json").read_text())["settings"]["workers"]
    return next(iter(workers.values()))


def test_random_tinyllama_runs_on_hf_with_exact_lengths(tmp_path):
    run_cli("run", "--backend", "hf", "--device", "cpu", "--strategy", "dynamic", *SMALL_RUN, "--out", str(tmp_path),
            timeout_s=900)
    facts = assert_exact_lengths(tmp_path)
    assert facts["weights"] == "random weights, real architecture" and "not the original's" in facts["tokenizer"]
    assert facts["n_params"] == 1_100_048_384 and facts["dtype"] == "bfloat16" and facts["load_s"] > 0
    assert facts["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2


@pytest.mark.vllm
def test_random_tinyllama_runs_on_vllm_with_its_dummy_loader(tmp_path):
    pytest.importorskip("vllm")
    config = tmp_path / "eager.yaml"
    config.write_text("enforce_eager: true\n")  # skips torch.compile on CPU (tens of seconds)
    run_cli("run", "--config", str(config), "--backend", "vllm", "--strategy", "continuous", "--memory-budget", "1GiB",
            *SMALL_RUN, "--out", str(tmp_path / "run"), timeout_s=900)
    facts = assert_exact_lengths(tmp_path / "run")
    assert facts["weights"] == "random weights, real architecture" and facts["load_format"].startswith("dummy")
    assert facts["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2 and facts["engine_start_s"] > 0
