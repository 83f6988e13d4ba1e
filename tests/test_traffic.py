"""traffic: arrival processes, prompt sources, schedules and the sending process."""
import json
import math
from pathlib import Path

import mistral_common
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece

from batchlab.traffic.arrivals import arrival_offsets
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.datasets import DatasetError, LengthSpec, _cache_path, load_conversations, load_sharegpt
from batchlab.traffic.schedule import build_schedule, load_schedule, save_schedule

TOKENIZER_FILE = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"


class SpTokenizer:
    """The Mistral v1 sentencepiece model behind the `encode(text) -> ids` interface."""

    def __init__(self) -> None:
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(TOKENIZER_FILE))

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)


@pytest.fixture(scope="session")
def tokenizer() -> SpTokenizer:
    return SpTokenizer()


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batchlab_home")


@pytest.fixture(autouse=True)
def _private_cache(shared_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHLAB_HOME", str(shared_home))


def _gaps(kind: str, rate: float, duration_s: float, burstiness: float = 1.0, seed: int = 7) -> np.ndarray:
    offsets = arrival_offsets(kind, rate, duration_s, np.random.default_rng(seed), burstiness=burstiness)
    return np.diff(offsets)


def _conversation(human: str, gpt: str) -> dict:
    return {"id": "x", "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


# --- arrivals -------------------------------------------------------------------------------------
def test_offsets_are_sorted_and_inside_the_duration() -> None:
    offsets = arrival_offsets("gamma", 30.0, 20.0, np.random.default_rng(1), burstiness=0.3)
    assert offsets[0] == 0.0 and offsets[-1] < 20.0
    assert np.all(np.diff(offsets) >= 0)


def test_poisson_mean_gap_is_one_over_rate() -> None:
    rate = 40.0
    gaps = _gaps("poisson", rate, 100.0)
    standard_error = (1 / rate) / math.sqrt(len(gaps))  # exponential: std = mean
    assert len(gaps) > 3000
    assert abs(gaps.mean() - 1 / rate) < 5 * standard_error


def _assert_gap_variance(gaps: np.ndarray, rate: float, burstiness: float) -> None:
    """Sample variance within 5 standard errors of 1/(rate^2 burstiness) (gamma kurtosis 3 + 6/k)."""
    expected = 1 / (rate**2 * burstiness)
    relative_se = math.sqrt((2 + 6 / burstiness) / len(gaps))
    assert abs(gaps.var() / expected - 1) < 5 * relative_se


def test_gamma_burstiness_quarter_has_four_times_poisson_gap_variance() -> None:
    rate = 100.0
    poisson, bursty, gamma_one = (_gaps("poisson", rate, 200.0), _gaps("gamma", rate, 200.0, 0.25),
                                  _gaps("gamma", rate, 200.0, 1.0))
    _assert_gap_variance(poisson, rate, 1.0)
    _assert_gap_variance(bursty, rate, 0.25)
    _assert_gap_variance(gamma_one, rate, 1.0)
    assert 3.0 < bursty.var() / poisson.var() < 5.0
    assert abs(bursty.mean() - 1 / rate) < 5 * (2 / rate) / math.sqrt(len(bursty))


def test_constant_gaps_are_exactly_one_over_rate() -> None:
    gaps = _gaps("constant", 8.0, 10.0)
    assert len(gaps) == 79
    np.testing.assert_allclose(gaps, 1 / 8.0, rtol=1e-12, atol=0)


@pytest.mark.parametrize("kind,rate,duration_s,burstiness,words", [
    ("poisson", 0.0, 1.0, 1.0, "rate"), ("poisson", 1.0, -1.0, 1.0, "duration"),
    ("gamma", 1.0, 1.0, 0.0, "burstiness"), ("zipf", 1.0, 1.0, 1.0, "unknown arrival kind"),
])
def test_bad_arrival_arguments_raise_value_error(kind: str, rate: float, duration_s: float,
                                                 burstiness: float, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        arrival_offsets(kind, rate, duration_s, np.random.default_rng(0), burstiness=burstiness)


# --- datasets -------------------------------------------------------------------------------------
def test_sharegpt_loading_survives_the_truncated_file() -> None:
    pairs = load_sharegpt()
    assert pairs.truncated
    assert pairs.parsed > 17_000
    assert len(pairs.prompts) == len(pairs.replies) == pairs.parsed - pairs.skipped > 10_000


def test_jsonl_with_a_broken_line_loads_the_good_lines(tmp_path: Path) -> None:
    path = tmp_path / "convs.jsonl"
    good = [json.dumps(_conversation(f"question {i}", f"answer {i}")) for i in range(3)]
    path.write_text("\n".join([good[0], '{"conversations": [ broken', good[1], "", good[2]]) + "\n")
    pairs = load_conversations(path)
    assert pairs.prompts == ["question 0", "question 1", "question 2"]
    assert pairs.replies == ["answer 0", "answer 1", "answer 2"]
    assert pairs.skipped == 1


def test_json_array_keeps_only_human_then_gpt_conversations(tmp_path: Path) -> None:
    wrong_order = {"conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "b"}]}
    items = [_conversation("q1", "a1"), wrong_order, {"no": "turns"}, _conversation("q2", "a2")]
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(items, indent=1)[:-40])  # cut inside the last element
    pairs = load_conversations(path)
    assert pairs.prompts == ["q1"] and pairs.skipped == 2 and pairs.truncated


def test_second_load_reads_the_parquet_cache(tmp_path: Path) -> None:
    path = tmp_path / "convs.jsonl"
    path.write_text(json.dumps(_conversation("q", "a")) + "\n")
    first = load_conversations(path)
    assert _cache_path(path).is_file()
    assert load_conversations(path) == first


def test_missing_or_unusable_file_raises_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_conversations(tmp_path / "nope.json")
    (tmp_path / "junk.jsonl").write_text("not json\n[1, 2]\n")
    with pytest.raises(DatasetError, match="no usable"):
        load_conversations(tmp_path / "junk.jsonl")


# --- schedules ------------------------------------------------------------------------------------
def _sharegpt_cfg(**kw: object) -> TrafficConfig:
    return TrafficConfig(**{"arrival": "poisson", "rate": 10.0, "duration_s": 6.0, **kw})


def test_same_seed_gives_identical_schedule_and_different_seed_does_not(tokenizer: SpTokenizer) -> None:
    a, b = build_schedule(_sharegpt_cfg(seed=3), tokenizer), build_schedule(_sharegpt_cfg(seed=3), tokenizer)
    pd.testing.assert_frame_equal(a.frame, b.frame)
    assert a.content_hash == b.content_hash
    assert build_schedule(_sharegpt_cfg(seed=4), tokenizer).content_hash != a.content_hash


@pytest.mark.parametrize("dataset", ["sharegpt", "synthetic"])
def test_prompt_sequence_is_identical_at_two_rates(tokenizer: SpTokenizer, dataset: str) -> None:
    slow = build_schedule(_sharegpt_cfg(rate=5.0, dataset=dataset), tokenizer).frame
    fast = build_schedule(_sharegpt_cfg(rate=40.0, arrival="gamma", burstiness=0.5, dataset=dataset),
                          tokenizer).frame
    assert len(fast) > len(slow) > 10
    head = fast.iloc[:len(slow)].reset_index(drop=True)
    for column in ("prompt", "output_len"):
        assert head[column].tolist() == slow[column].tolist()
    assert [list(map(int, t)) for t in head.prompt_tokens] == [list(map(int, t)) for t in slow.prompt_tokens]


def test_sharegpt_lengths_respect_the_limits(tokenizer: SpTokenizer) -> None:
    cfg = _sharegpt_cfg(rate=50.0, max_new_tokens=64, max_prompt_len=300)
    frame = build_schedule(cfg, tokenizer).frame
    assert frame["output_len"].between(2, 64).all()
    assert frame["prompt_len"].between(4, 300).all()
    assert frame["prompt_len"].tolist() == [len(t) for t in frame["prompt_tokens"]]
    assert frame["prompt_tokens"].iloc[0] == tokenizer.encode(frame["prompt"].iloc[0])


def test_synthetic_prompts_follow_their_length_spec() -> None:
    cfg = _sharegpt_cfg(rate=50.0, dataset="synthetic", vocab_size=500, max_new_tokens=20,
                        prompt_lengths=LengthSpec(dist="fixed", mean=17), output_lengths=LengthSpec(min=10, max=40))
    frame = build_schedule(cfg, None).frame
    tokens = np.concatenate(frame["prompt_tokens"].map(np.asarray).to_list())
    assert (frame["prompt_len"] == 17).all() and (frame["prompt"] == "").all()
    assert tokens.min() >= 100 and tokens.max() < 500
    assert frame["output_len"].between(10, 20).all() and (frame["output_len"] == 20).any()


def test_saved_schedule_round_trips_with_its_hash(tmp_path: Path, tokenizer: SpTokenizer) -> None:
    schedule = build_schedule(_sharegpt_cfg(), tokenizer)
    save_schedule(schedule, tmp_path / "s.parquet")
    loaded = load_schedule(tmp_path / "s.parquet")
    pd.testing.assert_frame_equal(loaded.frame, schedule.frame)
    assert loaded.content_hash == schedule.content_hash
    assert loaded.config == schedule.config and loaded.duration_s == 6.0


def test_tampered_schedule_is_rejected(tmp_path: Path) -> None:
    schedule = build_schedule(_sharegpt_cfg(dataset="synthetic"), None)
    path = tmp_path / "s.parquet"
    save_schedule(schedule, path)
    table = pq.read_table(path)
    frame = table.to_pandas()
    frame.loc[2, "output_len"] += 1
    pq.write_table(pa.Table.from_pandas(frame, schema=table.schema, preserve_index=False), path)
    with pytest.raises(DatasetError, match="integrity"):
        load_schedule(path)

