"""Exact statistics in bounded memory (stats.quantiles) equal numpy's over the same values, however
the values are chunked, including when a selection needs several passes to narrow its bucket."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from batchlab.collector.merge import GapSpill
from batchlab.stats import quantiles
from batchlab.stats.metrics import percentiles
from batchlab.stats.quantiles import chunked_percentiles, key_value, select_ranks, sortable_keys

STATS = ("mean", "p50", "p90", "p99", "max_abs", "p0", "p100", "p33.3")
finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, width=64)


def chunked(values: np.ndarray, size: int):
    return lambda: (values[i:i + size] for i in range(0, len(values), size))


@settings(max_examples=150, deadline=None)
@given(values=st.lists(finite | st.sampled_from([0.0, 1e-3, 5e-3, 5e-3 + 1e-18]), min_size=1, max_size=300),
       size=st.integers(1, 64), candidates=st.sampled_from([0, 1, 4, 1 << 20]))
def test_chunked_percentiles_equal_numpy_over_the_whole_array(values, size, candidates):
    quantiles_max = quantiles.CANDIDATES_MAX
    quantiles.CANDIDATES_MAX = candidates  # 0: every selection narrows its bucket down to one key
    try:
        arr = np.array(values, dtype=np.float64)
        got = chunked_percentiles(chunked(arr, size), STATS)
    finally:
        quantiles.CANDIDATES_MAX = quantiles_max
    assert got == percentiles(arr, STATS)
    for q in (0, 33.3, 50, 90, 99, 100):
        assert got[f"p{q:g}"] == np.percentile(arr, q)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=200), data=st.data())
def test_select_ranks_gives_the_sorted_values(values, data):
    arr = np.array(values, dtype=np.float64)
    ranks = data.draw(st.lists(st.integers(0, len(arr) - 1), min_size=1, max_size=5))
    assert select_ranks(chunked(arr, 7), len(arr), ranks) == {r: float(np.sort(arr)[r]) for r in ranks}


def test_keys_sort_as_the_values_and_map_back():
    values = np.array([-np.inf, -1e300, -2.5, -5e-324, -0.0, 0.0, 5e-324, 1e-3, 2.5, 1e300, np.inf])
    keys = sortable_keys(values)
    assert list(np.argsort(keys, kind="stable")) == list(range(len(values)))
    assert [key_value(int(k)) for k in keys] == values.tolist()


def test_the_mean_is_exact_whatever_the_chunks():
    values = np.array([1e16, 1.0, -1e16, 1.0] * 1000)
    assert percentiles(values, ("mean",)) == {"mean": 0.5}  # numpy's pairwise sum gives 0.0 here
    assert chunked_percentiles(chunked(values, 3), ("mean",)) == {"mean": 0.5}


def test_no_values_give_none():
    assert chunked_percentiles(lambda: iter([np.empty(0)]), ("mean", "p50")) == {"mean": None, "p50": None}


def test_a_million_equal_gaps_need_no_more_than_a_histogram_per_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(quantiles, "CANDIDATES_MAX", 1000)
    spill = GapSpill(tmp_path / "gaps.f64")
    values = np.full(1_000_000, 0.005)
    values[::1000] = np.linspace(0.001, 0.009, 1000)
    for i in range(0, len(values), 65_536):
        spill.add(values[i:i + 65_536].copy())
    try:
        got = chunked_percentiles(spill.chunks, ("p50", "p99", "mean"))
    finally:
        spill.close()
    assert got == percentiles(values, ("p50", "p99", "mean"))
    assert not (tmp_path / "gaps.f64").exists()


@pytest.mark.parametrize("nan_at", [0, 5])
def test_the_spill_drops_nan_as_percentiles_do(tmp_path, nan_at):
    spill = GapSpill(tmp_path / "g.f64")
    values = np.arange(10, dtype=np.float64)
    values[nan_at] = np.nan
    spill.add(values.copy())
    try:
        assert chunked_percentiles(spill.chunks, ("p50", "mean")) == percentiles(values, ("p50", "mean"))
    finally:
        spill.close()
