"""benchmarks/peer_check.py's pure parts (benchmarks/peer_figures.py): the schedule → timed_trace export
and the per-request figures (no server, no vLLM import)."""
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.schedule import build_schedule, load_schedule, save_schedule

ROOT = Path(__file__).resolve().parent.parent


def _peer_check():
    """The script's pure parts (benchmarks/peer_figures.py), reached as the script reaches them: loading
    the script itself also checks that it imports."""
    spec = importlib.util.spec_from_file_location("peer_check", ROOT / "benchmarks" / "peer_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from benchmarks import peer_figures

    assert module.PROMPT_FIELD is peer_figures.PROMPT_FIELD
    return peer_figures


def test_timed_trace_export_keeps_offsets_tokens_and_lengths(tmp_path):
    pc = _peer_check()
    schedule = build_schedule(TrafficConfig(arrival="poisson", rate=5.0, duration_s=4.0, seed=3,
                                            dataset="synthetic", max_new_tokens=32, max_prompt_len=64), None)
    save_schedule(schedule, tmp_path / "schedule.parquet")
    frame = load_schedule(tmp_path / "schedule.parquet").frame  # token ids as numpy arrays, as replayed
    n = pc.export_timed_trace(frame, tmp_path / "trace.jsonl")
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert n == len(lines) == len(frame) > 0
    for line, (_, row) in zip(lines, frame.iterrows()):
        entry = json.loads(line)
        assert entry["timestamp"] == row["arrival_offset_s"]
        assert entry["output_length"] == row["output_len"]
        assert entry[pc.PROMPT_FIELD] == [int(t) for t in row["prompt_tokens"]]
        assert entry["input_length"] == len(entry[pc.PROMPT_FIELD]) == row["prompt_len"]
    stamps = [json.loads(line)["timestamp"] for line in lines]
    assert stamps == sorted(stamps)


def test_bench_tpot_is_decode_time_over_output_minus_one():
    pc = _peer_check()
    result = {"ttfts": [0.5, 0.0, 0.2], "itls": [[0.1, 0.3], [], []], "output_lens": [3, 0, 1],
              "errors": ["", "boom", ""], "num_prompts": 3, "output_throughput": 7.0}
    per = pc.bench_requests(result)
    assert len(per) == 2  # the failed request is left out
    assert per["tpot"].iloc[0] == (0.1 + 0.3) / 2
    assert per["e2e"].iloc[0] == 0.5 + 0.4
    assert math.isnan(per["tpot"].iloc[1])  # one token: no decode step
    fig = pc.bench_figures([result])
    assert fig["completed"] == 2 and fig["submitted"] == 3
    assert fig["tpot_p50_ms"] == 200.0  # the one-token request does not count


def test_ratios_and_table():
    pc = _peer_check()
    a = pc.figures(pd.Series([0.2, 0.4]), pd.Series([0.05]), pd.Series([1.0]), 2, 2, 10.0)
    b = pc.figures(pd.Series([0.1, 0.2]), pd.Series([0.05]), pd.Series([0.5]), 2, 2, 20.0)
    r = pc.ratios(a, b)
    assert np.isclose(r["ttft_p50_ms"], 2.0) and np.isclose(r["tpot_p50_ms"], 1.0)
    assert np.isclose(r["output_tok_s"], 0.5)
    text = pc.table([("batchlab", a), ("vllm bench", b)])
    assert text.count("\n") == 3 and "| batchlab |" in text


def test_sender_lag_counts_from_the_most_punctual_request():
    pc = _peer_check()
    lag = pc.sender_lag([100.0, 101.5, 103.0], [0.0, 1.0, 3.0])
    assert np.allclose(lag, [0.0, 0.5, 0.0])
    result = {"ttfts": [0.1, 0.2, 0.3], "itls": [[0.1], [0.1], [0.1]], "output_lens": [2, 2, 2],
              "errors": ["", "", ""], "start_times": [100.0, 101.5, 103.0], "num_prompts": 3,
              "output_throughput": 1.0}
    per = pc.bench_requests(result, [0.0, 1.0, 3.0])
    assert np.allclose(per["ttft_planned"], [0.1, 0.7, 0.3])


def test_batchlab_throughput_is_the_summarys_definition(tmp_path):
    """Output tok/s over the window from the first arrival (stats.metrics), not from the run's t0."""
    from batchlab.collector.summary import write_summary
    from batchlab.lab.simulate import simulate_run
    from batchlab.protocol.settings import RunConfig
    from batchlab.stats.metrics import summarize

    pc = _peer_check()
    cfg = RunConfig(backend="sim", strategy="dynamic", dataset="synthetic", rate=20, duration_s=1.0,
                    max_new_tokens=8, seed=1, out=str(tmp_path)).validate()
    summary = simulate_run(cfg)
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    late = [c for c in requests.columns if c.endswith("_time")]
    requests[late] += 1.0  # traffic's first request 1 s after t0
    requests.to_parquet(tmp_path / "requests.parquet")
    summary.throughput_tok_s = summarize(requests, None, {}, itl=np.empty(0))["throughput_tok_s"]
    write_summary(tmp_path, summary)
    assert pc.batchlab_figures([tmp_path])["output_tok_s"] == pytest.approx(summary.throughput_tok_s)
    assert summary.throughput_tok_s > requests["n_tokens"].sum() / requests["completion_time"].max()
