"""Traces: the shipped Azure files, generic CSV / JSONL traces, windows and rescaling, exact-length
prompts, capping, synthetic length settings, and the schedule's saved settings and notes."""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from batchlab.report.plots import arrival_rate
from batchlab.traffic.arrivals import trace_window
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.datasets import DatasetError
from batchlab.traffic.lengths import LengthSpec, parse_lengths
from batchlab.traffic.run_schedule import traffic_config
from batchlab.traffic.schedule import build_schedule, load_schedule, save_schedule, saved_notes, saved_settings
from batchlab.traffic.traces import BUILTIN_TRACES, DATA_DIR, is_trace_dataset, load_trace
from tests.test_traffic import SpTokenizer


def trace_cfg(**kw) -> TrafficConfig:
    """A 60 s replay of azure-conv from 100 s at its own rate, unless `kw` says otherwise."""
    return TrafficConfig(**{"arrival": "trace", "rate": 0.0, "duration_s": 60.0, "dataset": "azure-conv",
                            "trace_start_s": 100.0, **kw})


def write_csv(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# --- the shipped files ----------------------------------------------------------------------------
@pytest.mark.parametrize("name, n, span_s", [("azure-conv", 19_366, 3_502), ("azure-code", 8_819, 3_436)])
def test_shipped_azure_traces_hold_the_documented_requests(name: str, n: int, span_s: float) -> None:
    trace = load_trace(name)
    assert trace.n_requests == n and trace.skipped == 0
    assert trace.offsets_s[0] == 0.0 and np.all(np.diff(trace.offsets_s) >= 0)
    assert trace.span_s == pytest.approx(span_s, abs=1.0)
    assert trace.input_lens.min() >= 1 and trace.output_lens.min() >= 1


def test_the_license_and_attribution_ship_beside_the_traces() -> None:
    assert all(path.parent == DATA_DIR and path.is_file() for path in BUILTIN_TRACES.values())
    assert "Attribution 4.0 International" in (DATA_DIR / "LICENSE").read_text(encoding="utf-8-sig")
    assert "Splitwise" in (DATA_DIR / "README.md").read_text()


# --- windows and rescaling ------------------------------------------------------------------------
def test_native_window_keeps_the_traces_own_times() -> None:
    trace = load_trace("azure-conv")
    schedule = build_schedule(trace_cfg(), None)
    inside = trace.offsets_s[(trace.offsets_s >= 100.0) & (trace.offsets_s < 160.0)]
    np.testing.assert_allclose(schedule.frame["arrival_offset_s"], inside - 100.0)
    assert schedule.notes["trace_requests"] == len(inside) and schedule.notes["trace_speedup"] == 1.0


@pytest.mark.parametrize("rate", [2.0, 20.0])
def test_rescaled_window_hits_the_mean_rate_and_keeps_the_burst_shape(rate: float) -> None:
    trace = load_trace("azure-conv")
    window = trace_window(trace.offsets_s, trace.span_s, 100.0, 60.0, rate)
    assert len(window.offsets_s) == round(rate * 60.0)
    assert window.offsets_s.min() >= 0.0 and window.offsets_s.max() < 60.0
    bins = 12  # the same 12 slices of the window, in trace time and in run time
    native = trace.offsets_s[window.first:window.first + len(window.offsets_s)]
    native_counts, _ = np.histogram(native, bins=bins, range=(window.start_s, window.end_s))
    run_counts, _ = np.histogram(window.offsets_s, bins=bins, range=(0.0, 60.0))
    assert np.abs(native_counts - run_counts).sum() <= 2  # a request on a bin edge may round across it
    assert native_counts.max() > 1.3 * native_counts.min()  # the trace is bursty, so the check bites


def test_a_window_the_trace_cannot_fill_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="needs 60000 requests; the trace holds"):
        build_schedule(trace_cfg(rate=1000.0), None)
    with pytest.raises(ValueError, match="trace start"):
        build_schedule(trace_cfg(trace_start_s=5000.0), None)
    with pytest.raises(ValueError, match="no trace"):
        build_schedule(TrafficConfig(arrival="trace", rate=0.0, duration_s=5.0, dataset="synthetic"), None)


def test_generated_arrivals_take_the_traces_lengths_in_order() -> None:
    trace = load_trace("azure-code")
    cfg = TrafficConfig(arrival="poisson", rate=5.0, duration_s=20.0, dataset="azure-code", trace_start_s=100.0,
                        max_prompt_len=100_000, max_new_tokens=100_000)
    frame = build_schedule(cfg, None).frame
    first = int(np.searchsorted(trace.offsets_s, 100.0))
    n = len(frame)
    assert list(frame["prompt_len"]) == list(trace.input_lens[first:first + n])
    assert list(frame["output_len"]) == list(trace.output_lens[first:first + n])


# --- prompts of exactly the trace's length, capping -----------------------------------------------
def test_capped_lengths_are_counted_and_prompts_have_exactly_the_capped_length() -> None:
    trace = load_trace("azure-conv")
    schedule = build_schedule(trace_cfg(max_prompt_len=1000, max_new_tokens=100), None)
    first = int(np.searchsorted(trace.offsets_s, 100.0))
    inputs = trace.input_lens[first:first + schedule.n_requests]
    outputs = trace.output_lens[first:first + schedule.n_requests]
    frame = schedule.frame
    assert schedule.notes["capped_prompts"] == int((inputs > 1000).sum()) > 0
    assert schedule.notes["capped_outputs"] == int((outputs > 100).sum()) > 0
    assert list(frame["prompt_len"]) == list(np.minimum(inputs, 1000))
    assert list(frame["output_len"]) == list(np.minimum(outputs, 100))
    assert list(frame["prompt_tokens"].map(len)) == list(frame["prompt_len"])
    assert schedule.notes["prompt_source"] == "synthetic-ids"


def test_with_a_tokenizer_prompts_are_sharegpt_token_ids_cut_to_length() -> None:
    tokenizer = SpTokenizer()
    schedule = build_schedule(trace_cfg(duration_s=10.0), tokenizer)
    assert schedule.notes["prompt_source"] == "sharegpt-cut"
    tokens = schedule.frame["prompt_tokens"]
    assert list(tokens.map(len)) == list(schedule.frame["prompt_len"])
    starts = {tuple(t[:16]) for t in tokens if len(t) >= 16}
    assert len(starts) == sum(len(t) >= 16 for t in tokens)  # consecutive pieces: no two share a start


# --- generic traces -------------------------------------------------------------------------------
def test_a_burstgpt_style_csv_replays_sorted_with_zero_lengths_skipped(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "burst.csv", "Timestamp,Model,Request tokens,Response tokens\n"
                     "5.0,ChatGPT,30,7\n1.0,GPT-4,10,3\n2.5,ChatGPT,20,0\n3.0,ChatGPT,40,9\n")
    trace = load_trace(path)
    assert list(trace.offsets_s) == [0.0, 2.0, 4.0] and list(trace.input_lens) == [10, 40, 30]
    assert trace.skipped == 1 and is_trace_dataset(path)


def test_iso_timestamps_and_mooncake_milliseconds_become_seconds(tmp_path: Path) -> None:
    iso = write_csv(tmp_path / "log.csv", "time,prompt_len,output_len\n"
                    "2024-01-01T00:00:00Z,5,6\n2024-01-01T00:00:01.5Z,7,8\n")
    assert list(load_trace(iso).offsets_s) == [0.0, 1.5]
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text("".join(json.dumps({"timestamp": t, "input_length": 9, "output_length": 4,
                                            "hash_ids": [0]}) + "\n" for t in (0, 250, 3052)))
    assert is_trace_dataset(str(mooncake))
    assert list(load_trace(str(mooncake)).offsets_s) == [0.0, 0.25, 3.052]


def test_a_sharegpt_jsonl_is_not_taken_for_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"id": "x", "conversations": [{"from": "human", "value": "hi"}]}) + "\n")
    assert not is_trace_dataset(str(path))


@pytest.mark.parametrize("name, text, message", [
    ("bad.csv", "timestamp,input_len,output_len\n0,5,6\n1,five,6\n", r"bad\.csv line 3: input_len 'five'"),
    ("half.csv", "timestamp,input_len,output_len\n0,5,6\n1,5.5,6\n", r"line 3: input_len '5.5' is not a whole"),
    ("when.csv", "timestamp,input_len,output_len\n0,5,6\nsoon,5,6\n", r"line 3: timestamp 'soon'"),
    ("cols.csv", "timestamp,tokens,output_len\n0,5,6\n", r"no input length column: expected one of"),
    ("lines.jsonl", '{"timestamp": 0, "input_len": 1, "output_len": 1}\n[1]\n', r"lines\.jsonl line 2: not a JSON"),
    ("keys.jsonl", '{"timestamp": 0, "input_len": 1, "output_len": 1}\n{"timestamp": 1, "input_len": 1}\n',
     r"line 2: output_len None"),
])
def test_bad_trace_input_is_one_dataset_error_line_naming_file_and_line(tmp_path: Path, name: str, text: str,
                                                                         message: str) -> None:
    path = write_csv(tmp_path / name, text)
    with pytest.raises(DatasetError, match=message) as info:
        load_trace(f"trace:{path}")
    assert "\n" not in str(info.value)


# --- synthetic lengths ----------------------------------------------------------------------------
@pytest.mark.parametrize("value, spec", [
    (128, LengthSpec(dist="fixed", mean=128)), ("128", LengthSpec(dist="fixed", mean=128)),
    ("32-512", LengthSpec(dist="uniform", min=32, max=512)), ([64, 128], LengthSpec(dist="choice", values=[64, 128])),
    ("64,128", LengthSpec(dist="choice", values=[64, 128])),
    ("lognormal:mean=300,sigma=0.25", LengthSpec(dist="lognormal", mean=300, sigma=0.25)),
    ({"dist": "lognormal", "mean": 300}, LengthSpec(dist="lognormal", mean=300)),
])
def test_length_settings_read_every_form_and_write_back_their_text(value: object, spec: LengthSpec) -> None:
    parsed = parse_lengths(value, LengthSpec(), "prompt_lengths")
    assert parsed == spec
    assert parse_lengths(parsed.text(), LengthSpec()) == parsed


@pytest.mark.parametrize("value", ["many", "0", "12.5", True, "5-2", {"dist": "wide"}, "lognormal:mode=3"])
def test_unreadable_length_settings_name_the_setting(value: object) -> None:
    with pytest.raises(ValueError, match="prompt_lengths"):
        parse_lengths(value, LengthSpec(), "prompt_lengths")


def test_run_settings_ask_for_128_in_and_32_out() -> None:
    run = SimpleNamespace(arrival="poisson", rate=20.0, duration_s=2.0, burstiness=1.0, seed=3, dataset="synthetic",
                          max_new_tokens=128, max_prompt_len=1024, prompt_lengths=128, output_lengths="32")
    frame = build_schedule(traffic_config(run), None).frame
    assert set(frame["prompt_len"]) == {128} and set(frame["output_len"]) == {32}


def test_run_settings_without_the_new_fields_keep_todays_defaults() -> None:
    run = SimpleNamespace(arrival="poisson", rate=20.0, duration_s=2.0, burstiness=1.0, seed=3, dataset="synthetic",
                          max_new_tokens=128, max_prompt_len=1024)
    default = TrafficConfig(arrival="poisson", rate=20.0, duration_s=2.0, seed=3, dataset="synthetic")
    assert traffic_config(run) == default


# --- saved settings, notes, determinism -----------------------------------------------------------
def test_new_settings_and_notes_round_trip_through_a_saved_schedule(tmp_path: Path) -> None:
    cfg = trace_cfg(rate=8.0, duration_s=20.0, trace_start_s=250.5, prompt_lengths=LengthSpec(dist="choice", values=[7]))
    schedule = build_schedule(cfg, None)
    path = tmp_path / "schedule.parquet"
    save_schedule(schedule, path)
    loaded = load_schedule(path)
    assert loaded.config == cfg and loaded.notes == schedule.notes and loaded.content_hash == schedule.content_hash
    assert saved_notes(path)["trace_window_s"][0] == 250.5
    settings, exact = saved_settings(path)
    assert exact and settings["trace_start_s"] == 250.5 and settings["prompt_lengths"] == "7"
    assert settings["arrival"] == "trace" and settings["output_lengths"] == "16-256"


def test_same_seed_same_trace_schedule_and_another_seed_other_prompt_ids() -> None:
    a, b = build_schedule(trace_cfg(rate=5.0), None), build_schedule(trace_cfg(rate=5.0), None)
    c = build_schedule(trace_cfg(rate=5.0, seed=1), None)
    assert a.content_hash == b.content_hash != c.content_hash
    np.testing.assert_array_equal(a.frame["arrival_offset_s"], c.frame["arrival_offset_s"])  # the trace's times


# --- the report's arrival rate --------------------------------------------------------------------
def test_arrival_rate_counts_arrivals_per_bin_as_requests_per_second() -> None:
    requests = pd.DataFrame({"arrival_time": [0.1, 0.2, 0.3, 0.4, 1.5, 2.9, np.nan]})
    starts, rates, bin_s = arrival_rate(requests, bin_s=1.0)
    assert bin_s == 1.0 and list(starts) == [0.0, 1.0, 2.0] and list(rates) == [4.0, 1.0, 1.0]


def test_default_arrival_rate_bins_end_at_the_last_arrival() -> None:
    requests = pd.DataFrame({"arrival_time": np.arange(0.0, 120.0, 0.5)})  # 2 req/s until 119.5 s
    starts, rates, bin_s = arrival_rate(requests)
    assert len(starts) == 60 and bin_s == pytest.approx(119.5 / 60)
    assert rates.sum() * bin_s == pytest.approx(240) and rates.min() >= 1.5  # no short last bin reads as a drop
