"""report.tokens: a run's tokens read a slice at a time into blocks of whole requests give the figures the whole
table gives; a table out of order is sorted first; a long line is drawn from its envelope."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchlab.protocol.errors import RunRefused
from batchlab.protocol.run_dir import RunDir
from batchlab.report.plots import envelope, itl_distribution
from batchlab.report.points import _tokens
from batchlab.report.stats import gap_percentiles
from batchlab.report.tokens import CARRIED, NA, PLAIN, flags_for, frame_digest, read_digest
from batchlab.stats.metrics import inter_token_latencies, percentiles


def table(seed: int = 0, requests: int = 40) -> pd.DataFrame:
    """Tokens of `requests` requests of 1 to 9 tokens each, in (request_id, token_index) order."""
    rng = np.random.default_rng(seed)
    rows = [(rid, i, float(t)) for rid in range(requests)
            for i, t in enumerate(np.cumsum(rng.uniform(0.01, 0.2, rng.integers(1, 10))))]
    return pd.DataFrame(rows, columns=["request_id", "token_index", "time"])


def write(folder, frame: pd.DataFrame):
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), RunDir(folder).table("tokens"))
    return folder


def no_check(frame: pd.DataFrame) -> None:
    """Accept every slice."""


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 1000])
def test_slices_give_the_whole_tables_gaps_and_spans_in_blocks_of_whole_requests(tmp_path, chunk_rows):
    tokens = table()
    got = read_digest(write(tmp_path / "run", tokens), no_check, chunk_rows=chunk_rows)
    whole = frame_digest(tokens)
    assert np.array_equal(np.concatenate(list(got.itl_chunks())), inter_token_latencies(tokens).to_numpy())
    assert np.array_equal(np.concatenate(list(got.itl_chunks())), np.concatenate(list(whole.itl_chunks())))
    ids = np.concatenate([b.request_ids for b in got.blocks])
    assert len(ids) == len(set(ids)) == tokens["request_id"].nunique()  # no request in two blocks
    by_request = tokens.groupby("request_id")["time"]
    assert got.spans().sort_index().to_numpy() == pytest.approx((by_request.max() - by_request.min()).to_numpy())
    some = [3, 4, 17, 39]
    assert gap_percentiles([got], [some]) == pytest.approx(percentiles(inter_token_latencies(tokens, pd.Series(some))))


def test_a_table_out_of_order_is_sorted_first(tmp_path):
    tokens = table(seed=1)
    shuffled = tokens.sample(frac=1, random_state=0)
    got = read_digest(write(tmp_path / "run", shuffled), no_check, chunk_rows=5)
    assert np.array_equal(np.concatenate(list(got.itl_chunks())), inter_token_latencies(tokens).to_numpy())


def test_a_token_index_given_twice_counts_as_the_whole_table_counts_it(tmp_path):
    tokens = table(seed=3)
    doubled = pd.concat([tokens, tokens.iloc[[5]]], ignore_index=True)  # a row written twice, at the end
    got = read_digest(write(tmp_path / "run", doubled), no_check, chunk_rows=4)
    assert np.array_equal(np.concatenate(list(got.itl_chunks())), inter_token_latencies(doubled).to_numpy())
    assert 0.0 in np.concatenate(list(got.itl_chunks()))


def test_a_bad_slice_after_good_ones_refuses_the_run_in_one_line(tmp_path):
    tokens = table(seed=2)
    tokens.loc[len(tokens) - 1, "token_index"] = -1  # a count below 0 in the last rows
    folder = write(tmp_path / "run", tokens)
    with pytest.raises(RunRefused, match="negative counts in token_index") as info:
        _tokens(folder, None)
    assert "\n" not in str(info.value)


def test_step_flags_follow_the_requests_worker_and_the_step_that_holds_the_token():
    finished = pd.DataFrame({"request_id": [1, 2], "worker": ["w0", "w1"]})
    steps = pd.DataFrame({"worker": ["w0", "w0", "w1"], "start_time": [0.0, 0.1, 0.0],
                          "end_time": [0.1, 0.2, 0.3], "prefill_tokens": [5, 0, 9]})
    tokens = pd.DataFrame({"request_id": [1, 1, 1, 2, 2], "token_index": [0, 1, 2, 0, 1],
                           "time": [0.05, 0.15, 0.5, 0.1, 0.2]})
    digest = frame_digest(tokens, flags_for(finished, steps))
    assert [b.flags.tolist() for b in digest.blocks] == [[PLAIN, NA], [CARRIED]]  # 0.5: in no step of w0


def test_the_envelope_keeps_each_bins_ends_and_extremes_in_order():
    x = np.linspace(0, 100, 200_001)
    y = np.zeros(len(x))
    y[123_457] = 50.0  # one spike among 200,001 points
    ex, ey = envelope(pd.Series(x), pd.Series(y), points=400)
    assert len(ex) <= 400 and 50.0 in ey and ex[0] == 0 and ex[-1] == 100
    assert np.all(np.diff(ex) > 0)
    short_x, short_y = envelope(pd.Series([0.0, 1.0]), pd.Series([2.0, 3.0]))
    assert short_x.tolist() == [0.0, 1.0] and short_y.tolist() == [2.0, 3.0]


class _Run:
    def __init__(self, tokens: pd.DataFrame) -> None:
        self.digest = frame_digest(tokens)

    def token_digest(self):
        return self.digest


class _Collection:
    def __init__(self, runs: dict) -> None:
        self.runs = runs

    def at_rate(self, rate: float) -> dict:
        return self.runs


def test_the_itl_plot_draws_a_label_without_a_token_beside_one_with_gaps(tmp_path):
    gaps = _Run(pd.DataFrame({"request_id": [0, 0, 0], "token_index": [0, 1, 2], "time": [0.0, 0.1, 0.3]}))
    none = _Run(pd.DataFrame(columns=["request_id", "token_index", "time"]))  # no token at all
    path = itl_distribution(_Collection({"a": [gaps], "b": [none]}), {}, 1.0, tmp_path / "itl.png")
    assert path.exists() and path.stat().st_size > 0
