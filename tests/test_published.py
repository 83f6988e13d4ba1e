"""simulator/measurements.py and simulator/published.py: reading published configurations, replaying them in the
simulator with known step models, the front end, the benchmark's metrics, and the validation table's arithmetic
on a small fixed set."""
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from batchlab.models.archs import ARCHS, kv_bytes_per_token
from batchlab.protocol import RequestMsg
from batchlab.scheduler.policies import Capacity
from batchlab.simulator.measurements import Measurement, PublishedError, load_measurements
from batchlab.simulator.published import (Direct, DirectParams, PublishedPrediction, delivered, front_end, group_errors,
                                          meets, replay)
from batchlab.worker.stepmodel import StepModel

SHIPPED = Path(__file__).resolve().parent.parent / "benchmarks" / "published" / "measurements.yaml"
# a memory-bound model with no compute term: decode = 2 ms + 1 ms (weights) + 0.1 ms a row; prefill = 2 + 1 + T·10 µs
KNOWN = StepModel("known", 1e9, 0, 1e12, 1e-5, 0.002, 80e9, decode_s_per_row=1e-4, fused=True)


def _row(split: str, metric: str, published: float, predicted: float, scored: bool = True,
         name: str = "c") -> PublishedPrediction:
    return PublishedPrediction(name, "src", "h100", split, metric, published, predicted, scored)


def test_group_errors_take_median_and_worst_of_absolute_errors_per_group_and_split():
    rows = [_row("check", "throughput_req_s", 10, 11, name="a"),  # +10%
            _row("check", "throughput_out_tok_s", 100, 70, name="b"),  # −30%
            _row("check", "throughput_req_s", 4, 4.2, name="c"),  # +5%
            _row("check", "tpot_median_s", 0.02, 0.019, name="d"),  # −5%
            _row("check", "ttft_median_s", 0.5, 1.0, scored=False, name="e"),  # not scored: left out
            _row("fit", "ttft_median_s", 0.1, 0.3, name="f")]  # another split
    errors = {e.group: e for e in group_errors(rows, "check")}
    assert set(errors) == {"throughput", "tpot"}
    assert errors["throughput"].count == 3
    assert errors["throughput"].median == pytest.approx(0.10)
    assert errors["throughput"].worst == pytest.approx(0.30)
    assert errors["throughput"].worst_row == "b throughput_out_tok_s"
    assert errors["tpot"].median == errors["tpot"].worst == pytest.approx(0.05)
    assert [e.group for e in group_errors(rows, "fit")] == ["ttft"]
    assert group_errors(rows, "fit")[0].median == pytest.approx(2.0)


def test_the_bar_needs_every_group_within_both_limits():
    rows = [_row("check", "throughput_req_s", 10, 10.5), _row("check", "ttft_median_s", 1, 1.2)]
    assert meets(group_errors(rows, "check"), 0.25, 0.25)
    assert not meets(group_errors(rows, "check"), 0.10, 0.25)  # TTFT's median 20% > 10%
    assert not meets(group_errors(rows, "check"), 0.25, 0.10)
    assert not meets([], 0.1, 0.25)  # no scored figure proves nothing


def test_front_end_serves_requests_one_at_a_time_in_arrival_order():
    sent = np.array([0.0, 0.0, 0.0, 1.0, 1.001])
    assert front_end(sent, 0.01).tolist() == pytest.approx([0.01, 0.02, 0.03, 1.01, 1.02])
    assert front_end(sent, 0.0).tolist() == sent.tolist()


def _measurement(**kw) -> Measurement:
    base = dict(id="m", source="s", link="l", engine="e", terms="t", gpu="h100", model="mistral-7b-v0.1",
                dtype="bf16", split="check", load="batch", prompts=[100] * 4, outputs=[10] * 4)
    return Measurement(**{**base, **kw})


def test_a_batch_replays_to_the_known_models_prefill_and_decode_steps():
    m = _measurement()
    p = replay(m, KNOWN).metrics
    prefill_s = 0.002 + 0.001 + 400 * 1e-5  # the 4 prompts in one step
    decode_s = 0.002 + 0.001 + 4 * 1e-4
    assert p["ttft_median_s"] == pytest.approx(prefill_s)
    assert p["tpot_median_s"] == pytest.approx(decode_s)
    assert p["batch_latency_s"] == pytest.approx(prefill_s + 9 * decode_s)
    assert p["throughput_out_tok_s"] == pytest.approx(40 / (prefill_s + 9 * decode_s))


def test_the_front_end_delays_ttft_and_e2e_but_not_the_engine():
    m = _measurement(prompts=[100], outputs=[10])
    plain, served = replay(m, KNOWN).metrics, replay(m, KNOWN, 0.005).metrics
    assert served["ttft_median_s"] == pytest.approx(plain["ttft_median_s"] + 0.005)
    assert served["tpot_median_s"] == pytest.approx(plain["tpot_median_s"])
    offline = replay(_measurement(prompts=[100], outputs=[10], serving=False), KNOWN, 0.005).metrics
    assert offline["ttft_median_s"] == pytest.approx(plain["ttft_median_s"])  # no HTTP server, no front end


def test_a_request_published_with_no_output_counts_ttft_zero_and_no_tpot_as_the_benchmark_did():
    m = _measurement(prompts=[100, 100, 100], outputs=[10, 0, 10])
    p = replay(m, KNOWN).metrics
    step = 0.002 + 0.001 + 300 * 1e-5
    assert p["ttft_mean_s"] == pytest.approx(2 * step / 3)
    assert p["ttft_median_s"] == pytest.approx(step)
    duration_s = step + 9 * (0.002 + 0.001 + 2 * 1e-4)  # the empty request leaves with its one simulated token
    assert p["throughput_out_tok_s"] == pytest.approx(20 / duration_s)  # and its output counts 0 tokens


def test_a_closed_loop_keeps_at_most_its_clients_running():
    m = _measurement(load="closed", concurrency=2, prompts=[50] * 6, outputs=[5] * 6)
    p = replay(m, KNOWN).metrics
    two_rows = 0.002 + 0.001 + 2 * 1e-4
    assert p["tpot_median_s"] == pytest.approx(two_rows)  # never more than 2 rows in a step


def test_direct_forwards_as_many_as_the_rows_take_whatever_the_kv_credit():
    policy = Direct(DirectParams(max_batch_size=3))
    queue = [RequestMsg(i, 0.0, 0.0, 1000, 1000) for i in range(5)]
    assert policy.decide(queue, 0.0, Capacity(2, 0, 1, False), False).n == 2  # no KV left: still the free rows
    assert policy.decide(queue, 0.0, Capacity(9, 10**9, 1, True), False).n == 3  # never past --max-num-seqs


def test_a_v0_replay_admits_prompts_by_blocks_and_preempts_where_a_reservation_would_hold_requests_back():
    # 4 prompts of 96 tokens (6 blocks each) and 64 outputs in a pool of 30 blocks: all 4 prompts fit at once
    # (a whole-request reservation, 160 tokens each, would start 3), then their growth runs the pool out
    kv = kv_bytes_per_token(ARCHS["mistral-7b-v0.1"], 2)  # the pool in blocks needs the model's bytes per token
    v0 = replace(KNOWN, prefill_alone=True, fused=False, kv_bytes_per_token=kv)
    m = _measurement(prompts=[96] * 4, outputs=[64] * 4, kv_tokens=30 * 16)
    p = replay(m, v0).metrics
    prefill_s = 0.002 + 0.001 + 4 * 96 * 1e-5
    assert p["ttft_median_s"] == pytest.approx(prefill_s)  # one prompt-only step for all four
    roomy = replay(_measurement(prompts=[96] * 4, outputs=[64] * 4), v0).metrics
    assert p["tpot_mean_s"] > roomy["tpot_mean_s"]  # a preempted row waits and is prefilled again


def test_async_output_hands_a_prompt_steps_tokens_over_when_the_next_prompt_step_ends():
    # worker a: prompt steps 0 and 1 back to back, then decode step 2; after an idle gap prompt steps 3 and 4 back
    # to back, and prompt step 5 after another gap. Worker b: one prompt step ending at 1.0, as a's step 0 does.
    steps = pd.DataFrame({"worker": ["a"] * 6 + ["b"], "step": [0, 1, 2, 3, 4, 5, 0],
                          "start_time": [0.0, 1.0, 2.0, 5.0, 6.0, 9.0, 0.0],
                          "end_time": [1.0, 2.0, 3.0, 6.0, 7.0, 10.0, 1.0], "prefill_tokens": [9, 9, 0, 9, 9, 9, 9]})
    # r0: step 0's first token; r1: step 1's (a decode step next); r2: a decode step's; r3: step 3's, its only
    # token; r4: step 4's (the next prompt step began later); r5: b's step; r6: no token
    first = [1.0, 2.0, 3.0, 6.0, 7.0, 1.0, np.nan]
    last = [3.0, 2.0, 3.0, 6.0, 10.0, 1.0, np.nan]
    arrival = [0.0, 0.0, 0.5, 4.0, 4.0, 0.0, 0.0]
    requests = pd.DataFrame({"request_id": range(7), "worker": ["a"] * 5 + ["b", "a"], "arrival_time": arrival,
                             "first_token_time": first, "completion_time": last,
                             "ttft": np.subtract(first, arrival), "e2e": np.subtract(last, arrival)})
    out = delivered(requests, steps)
    assert out["first_token_time"].tolist()[:6] == [2.0, 2.0, 3.0, 7.0, 7.0, 1.0]
    assert out["completion_time"].tolist()[:6] == [3.0, 2.0, 3.0, 7.0, 10.0, 1.0]  # a one-token request ends late
    assert out["ttft"].tolist()[:6] == [2.0, 2.0, 2.5, 3.0, 3.0, 1.0]
    assert out["e2e"].tolist()[:6] == [3.0, 2.0, 2.5, 3.0, 6.0, 1.0]
    assert out.loc[6, ["first_token_time", "ttft"]].isna().all()
    assert requests["first_token_time"].tolist()[:6] == first[:6]  # the run's own table is left as it was
    for none in (None, steps.iloc[:0]):  # a run with no continuous step: nothing moves
        assert delivered(requests, none).equals(requests)


def test_a_burst_over_three_prompt_steps_gets_its_first_tokens_one_step_late_the_last_two_together():
    kv = kv_bytes_per_token(ARCHS["mistral-7b-v0.1"], 2)
    v0 = replace(KNOWN, prefill_alone=True, fused=False, kv_bytes_per_token=kv, step_tokens=200)
    m = _measurement(prompts=[100] * 6, outputs=[10] * 6)  # 2 prompts a step: three prompt-only steps
    step = 0.002 + 0.001 + 200 * 1e-5
    plain, late = replay(m, v0).metrics, replay(m, v0, async_output=True).metrics
    assert plain["ttft_mean_s"] == pytest.approx(2 * step)  # 1, 2 and 3 steps
    assert late["ttft_mean_s"] == pytest.approx((2 * 2 + 4 * 3) * step / 6)  # 2, 3 and 3 steps
    assert late["batch_latency_s"] == pytest.approx(plain["batch_latency_s"])  # the decodes' tokens as before
    assert late["throughput_out_tok_s"] == pytest.approx(plain["throughput_out_tok_s"])


def _write(tmp_path, configurations, samples=None) -> Path:
    doc = {"samples": samples or {"s": {"prompts": [10, 30], "outputs": [5, 15]}},
           "sources": [{"id": "src", "title": "T", "link": "https://x", "engine": "vLLM 1.0", "terms": "t",
                        "gpu": "h100", "model": "mistral-7b-v0.1", "dtype": "bf16"}],
           "configurations": configurations}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _config(**kw) -> dict:
    return {"id": "c", "source": "src", "split": "check", "workload": {"fixed": {"prompt": 8, "output": 4, "count": 2}},
            "load": {"mode": "batch"}, "figures": [{"metric": "ttft_median_s", "value": 0.1, "where": "t1"}], **kw}


def test_workloads_fixed_sample_rescaled_and_spread(tmp_path):
    path = _write(tmp_path, [
        _config(id="fixed"),
        _config(id="sample", workload={"sample": {"name": "s", "count": 4, "prompt_mean": 40, "output_mean": 20}}),
        _config(id="spread", workload={"spread": {"prompt": 8, "output_min": 2, "output_max": 6, "count": 5}})])
    fixed, sample, spread = load_measurements(path)
    assert (fixed.prompts, fixed.outputs, fixed.source, fixed.gpu) == ([8, 8], [4, 4], "T", "h100")
    assert sample.prompts == [20, 60, 20, 60] and sample.outputs == [10, 30, 10, 30]  # cycled, means 40 and 20
    assert sorted(spread.outputs) == [2, 3, 4, 5, 6] and spread.prompts == [8] * 5


@pytest.mark.parametrize("bad, message", [
    ({"split": "train"}, "split must be one of"),
    ({"load": {"mode": "closed"}}, "closed loop needs its concurrency"),
    ({"load": {"mode": "open"}}, "open loop needs a finite rate"),
    ({"figures": [{"metric": "tokens", "value": 1}]}, "metrics must be among"),
    ({"figures": [{"metric": "ttft_median_s", "value": 0}]}, "every figure must be > 0"),
    ({"gpu": "rtx9090"}, "unknown GPU"),
])
def test_a_bad_configuration_is_one_line_naming_it(tmp_path, bad, message):
    with pytest.raises(PublishedError, match=message) as info:
        load_measurements(_write(tmp_path, [_config(**bad)]))
    assert "'c'" in str(info.value) and "\n" not in str(info.value)


def test_the_shipped_table_has_a_fit_and_a_check_set_over_enough_gpus_with_links():
    measurements = load_measurements(SHIPPED)
    check = [m for m in measurements if m.split == "check"]
    assert len(check) >= 12 and len({m.gpu for m in check}) >= 3  # the bar is counted on the check set
    assert [m for m in measurements if m.split == "fit"]
    assert all(m.link.startswith("https://") and m.engine and m.figures for m in measurements)
    assert all(f.where for m in measurements for f in m.figures)
    for m in measurements:  # at most one scored figure per group and configuration
        groups = [PublishedPrediction(m.id, "", m.gpu, m.split, f.metric, f.value, f.value, f.scored).group
                  for f in m.figures if f.scored]
        assert len(groups) == len(set(groups)), m.id
    lambda_a100 = next(m for m in measurements if m.id == "lambda-a100-320-prompts")
    assert (sum(lambda_a100.prompts), sum(lambda_a100.outputs)) == (73671, 71372)  # the file's totals
    totals = {"lambda-a100-20-prompts": (3438, 4880), "lambda-a100-80-prompts": (21713, 15899),  # each file's
              "lambda-a100-160-prompts": (37741, 33898), "lambda-h100-10-prompts": (1585, 2483),  # total_input_tokens,
              "lambda-h100-20-prompts": (3438, 4892), "lambda-h100-80-prompts": (21713, 16130),  # total_output_tokens
              "lambda-h100-160-prompts": (37741, 34120), "lambda-h100-llama3-10-prompts": (1369, 1867),
              "lambda-h100-llama3-40-prompts": (8595, 7692), "lambda-h100-llama3-320-prompts": (65578, 65331)}
    by_id = {m.id: m for m in measurements}
    llama_320 = by_id["lambda-h100-llama3-320-prompts"]  # the same sample in the Llama-3 tokenizer's lengths
    for name, total in totals.items():
        m = by_id[name]
        assert (sum(m.prompts), sum(m.outputs)) == total, name
        first = llama_320 if m.model == llama_320.model else lambda_a100
        if m is not first:  # the seed-0 sample's first N prompts
            assert m.prompts == first.prompts[:len(m.prompts)], name
    assert {(m.split, m.gpu) for m in measurements if m.source == llama_320.source} == {("fit", "h100")}
    assert not math.isinf(next(m for m in measurements if m.load == "open").rate)
