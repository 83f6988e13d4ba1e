"""Order-statistic percentile intervals and paired comparisons: coverage by simulation, existence bounds,
paired against unpaired, clusters, and how a result is phrased."""
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from batchlab.report.markdown import ci_table
from batchlab.report.points import RunData
from batchlab.report.stats import GroupStats, paired_latency, percentile_ci
from batchlab.stats.intervals import (
    PairedResult, _resample_counts, _weighted_stat, describe, design_effect, min_requests, order_ranks,
    between_repeats, paired_ratio, quantile_ci, t_quantile, unpaired_ratio)
from tests.summaries import make_summary


def exact_coverage(n: int, q: float, lo: int, up: int) -> float:
    """P(lo ≤ B < up), B ~ Binomial(n, q/100), term by term (independent of the module's cumulative sums)."""
    p = q / 100
    return sum(math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * math.log(p) + (n - k) * math.log1p(-p)) for k in range(lo, up))


@pytest.mark.parametrize("n,q", [(10, 50), (50, 50), (50, 90), (200, 50), (200, 90), (400, 90), (400, 99)])
def test_order_statistic_interval_covers_the_true_quantile_at_about_its_level(n, q):
    rng = np.random.default_rng(n * 100 + q)
    trials = rng.exponential(1.0, size=(4000, n))
    true = -math.log(1 - q / 100)  # exponential(1)'s q-th percentile
    covered = [(ci[0] <= true <= ci[1]) for ci in (quantile_ci(row, q) for row in trials)]
    assert 0.93 <= np.mean(covered) <= 0.99  # ≥ level up to Monte-Carlo slack, and not absurdly conservative


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 400), q=st.sampled_from([1, 10, 25, 50, 75, 90, 95, 99]),
       level=st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_ranks_cover_at_least_the_level_and_cannot_be_narrowed(n, q, level):
    ranks = order_ranks(n, q, level)
    assert (ranks is None) == (n < min_requests(q, level))
    if ranks is not None:
        lo, up = ranks
        assert 1 <= lo < up <= n and exact_coverage(n, q, lo, up) >= level - 1e-9
        assert exact_coverage(n, q, lo + 1, up) < level and exact_coverage(n, q, lo, up - 1) < level


def test_p99_has_no_interval_from_32_requests_and_the_minimum_is_computed():
    rng = np.random.default_rng(3)
    assert quantile_ci(rng.exponential(1.0, 32), 99) is None
    assert quantile_ci(rng.exponential(1.0, 32), 50) is not None
    assert min_requests(99) == math.ceil(math.log(0.05) / math.log(0.99))  # (min, max) first covers 95%: 299
    assert quantile_ci(rng.exponential(1.0, 298), 99) is None and quantile_ci(rng.exponential(1.0, 299), 99)


def test_the_interval_never_claims_more_than_the_sample_range_and_narrows_with_more_data():
    rng = np.random.default_rng(1)
    small, big = rng.exponential(1.0, 50), rng.exponential(1.0, 5000)
    lo_s, hi_s = quantile_ci(small, 50)
    lo_b, hi_b = quantile_ci(big, 50)
    assert small.min() <= lo_s < np.median(small) < hi_s <= small.max()
    assert lo_b < math.log(2) < hi_b and hi_b - lo_b < hi_s - lo_s
    assert quantile_ci([], 50) is None and quantile_ci([1.0, float("nan")], 50) is None


def test_repeats_that_disagree_widen_the_interval_and_one_repeat_changes_nothing():
    rng = np.random.default_rng(5)
    scales = np.repeat([0.6, 1.0, 1.6, 0.8, 1.3], 200)  # each repeat (seed) shifts every latency
    values, clusters = scales * rng.exponential(1.0, 1000), np.repeat(np.arange(5), 200)
    plain, clustered = quantile_ci(values, 50), quantile_ci(values, 50, clusters=clusters)
    assert design_effect(values, clusters, 50) > 2
    assert clustered[0] < plain[0] and plain[1] < clustered[1]
    assert quantile_ci(values, 90, clusters=np.zeros(1000)) == quantile_ci(values, 90)
    assert percentile_ci([values[:200], np.array([])], 50) == quantile_ci(values[:200], 50)


def test_weighted_statistic_equals_numpy_on_the_expanded_resample():
    rng = np.random.default_rng(2)
    x = rng.exponential(1.0, 40)
    counts = rng.multinomial(40, np.full(40, 1 / 40), size=5)
    counts[0] = 0
    counts[0, [3, 7]] = [4, 1]  # a resample of five values
    for q in (0, 10, 50, 99, 100):
        expanded = [np.percentile(np.repeat(x, c), q) for c in counts]
        assert _weighted_stat(x, counts, q) == pytest.approx(expanded)
    assert _weighted_stat(x, counts, None) == pytest.approx([np.repeat(x, c).mean() for c in counts])


def test_identical_strategies_are_not_significantly_different():
    rng = np.random.default_rng(7)
    same = rng.lognormal(0.0, 1.0, 300)
    result = paired_ratio(same, same.copy())
    assert result.estimate == 0 and not result.significant
    false_alarms = 0
    for seed in range(40):  # the same distribution, independent draws per side: ~5% may read as a difference
        r = np.random.default_rng(seed)
        false_alarms += paired_ratio(r.lognormal(0, 1, 200), r.lognormal(0, 1, 200), n_boot=400).significant
    assert false_alarms <= 6


def test_a_doubled_latency_is_significant_with_the_right_sign():
    rng = np.random.default_rng(8)
    b = rng.lognormal(0.0, 1.0, 200)
    a = 2 * b * rng.lognormal(0.0, 0.05, 200)
    up, down = paired_ratio(a, b), paired_ratio(b, a)
    assert up.significant and up.lo > 0 and up.estimate == pytest.approx(100, abs=10)
    assert down.significant and down.hi < 0 and down.estimate == pytest.approx(-50, abs=5)
    assert paired_ratio(a, b, q=None).lo > 0


def test_pairing_by_request_gives_a_tighter_interval_than_ignoring_the_ids():
    rng = np.random.default_rng(9)
    size = rng.lognormal(0.0, 1.0, 300)  # what a request brings to either strategy (its lengths)
    a, b = 1.1 * size * rng.lognormal(0, 0.1, 300), size * rng.lognormal(0, 0.1, 300)
    for q in (50, None):
        paired, unpaired = paired_ratio(a, b, q), unpaired_ratio(a, b, q)
        assert paired.hi - paired.lo < 0.5 * (unpaired.hi - unpaired.lo)
    assert paired_ratio(a, b, None).significant and not unpaired_ratio(a, b, None).significant


def test_one_cluster_gives_exactly_the_unclustered_result_and_several_differ():
    rng = np.random.default_rng(10)
    b = rng.lognormal(0.0, 1.0, 240)
    a = b * rng.lognormal(0.1, 0.3, 240)
    assert paired_ratio(a, b, clusters=np.full(240, 7)) == paired_ratio(a, b)
    clustered = paired_ratio(a, b, clusters=np.repeat([0, 1, 2], 80))
    assert clustered.clusters == 3 and clustered != paired_ratio(a, b)


def test_paired_bootstrap_draws_whole_clusters_and_is_deterministic():
    counts = next(_resample_counts([np.arange(5), np.arange(5, 8)], 8, 50, np.random.default_rng(0)))
    assert counts.shape == (50, 8) and set(counts.sum(axis=1)) <= {6, 8, 10}  # two clusters of 5 and 3 drawn whole
    rng = np.random.default_rng(11)
    a, b = rng.lognormal(0, 1, 400), rng.lognormal(0, 1, 400)
    assert paired_ratio(a, b) == paired_ratio(a, b)


def test_descriptions_use_a_true_minus_and_say_when_there_is_no_difference():
    assert describe(PairedResult(-48.2, -55.1, -40.4, 300, True)) == "TTFT p50 −48% [−55%, −40%]"
    assert (describe(PairedResult(-2.04, -9.0, 5.0, 300, False), "E2E p50")
            == "no significant difference in E2E p50 (−2% [−9%, +5%])")
    assert describe(PairedResult(0.004, -0.3, 0.3, 300, False)) == "no significant difference in TTFT p50 (+0.00% [−0.30%, +0.30%])"
    assert describe(None).startswith("too few requests")


def run(label: str, repeat: int, ttft_s: np.ndarray, finished: np.ndarray, seed: int = 0) -> RunData:
    """A run whose request i arrives at i s and has the given TTFT; unfinished ones failed."""
    n = len(ttft_s)
    arrival = np.arange(n, dtype=float)
    requests = pd.DataFrame({"request_id": np.arange(n), "status": np.where(finished, "finished", "failed"),
                             "output_len": 2, "arrival_time": arrival, "scheduled_time": arrival,
                             "first_token_time": np.where(finished, arrival + ttft_s, np.nan),
                             "completion_time": np.where(finished, arrival + ttft_s + 0.1, np.nan)})
    empty = pd.DataFrame()
    summary = make_summary(settings={"seed": seed + repeat})
    return RunData(label, 2.0, repeat, Path("."), summary, requests, empty, empty, empty)


def test_paired_latency_pairs_requests_both_finished_within_the_same_repeat():
    rng = np.random.default_rng(12)
    base = [rng.lognormal(-2, 0.5, 100) for _ in range(2)]
    done = np.ones(100, dtype=bool)
    half_done = done.copy()
    half_done[::2] = False
    runs_a = [run("dynamic", k, 0.5 * base[k], half_done) for k in range(2)]
    runs_b = [run("naive", k, base[k], done) for k in range(2)]
    result = paired_latency(runs_a, runs_b, "ttft", 50)
    assert result.n_pairs == 100 and result.clusters == 2  # 50 finished by both in each repeat
    assert result.significant and result.estimate == pytest.approx(-50)
    other_seed = [run("naive", k, base[k], done, seed=5) for k in range(2)]
    assert paired_latency(runs_a, other_seed) is None  # other seeds: the same ids are other requests


def test_ci_table_says_too_few_requests_where_the_interval_does_not_exist():
    latency = {m: {"mean": 0.1, "p50": 0.1, "p90": 0.2, "p99": 0.3} for m in ("ttft", "e2e", "tpot", "itl")}
    ci = {"ttft_p50": (0.09, 0.11), "ttft_p99": None, "e2e_p50": (0.1, 0.12), "e2e_p99": None}
    row = ci_table([GroupStats("naive", 2.0, 1, 10.0, 2.0, 32, 0, latency, ci, 0, 1.0, None)])[2]
    assert row == ("| naive | 2 | 0 / 32 (0%) | 90.0 – 110.0 | too few requests for p99 | 100.0 – 120.0 | "
                   "too few requests for p99 |")


def test_t_quantile_matches_the_printed_table():
    table = {(0.95, 1): 12.706, (0.95, 2): 4.303, (0.95, 4): 2.776, (0.95, 10): 2.228, (0.99, 7): 3.499,
             (0.90, 1): 6.314, (0.95, 120): 1.980}
    for (level, df), value in table.items():
        assert t_quantile(level, df) == pytest.approx(value, abs=1e-3)


@pytest.mark.parametrize("k", [3, 5, 10])
def test_between_repeat_intervals_cover_the_true_ratio_about_95_percent_of_the_time(k):
    rng = np.random.default_rng(k)
    true_pct, trials = 20.0, 2000  # each repeat's ratio: 1.2 × a lognormal run-to-run factor (σ = 0.1)
    covered = 0
    for _ in range(trials):
        r = between_repeats(1.2 * np.exp(rng.normal(0, 0.1, k)))
        covered += r.lo <= true_pct <= r.hi
    assert 0.935 <= covered / trials <= 0.965


def test_between_repeat_intervals_read_no_significant_difference_for_equal_strategies_95_percent_of_the_time():
    rng = np.random.default_rng(3)
    alarms = sum(between_repeats(np.exp(rng.normal(0, 0.05, 3))).significant for _ in range(2000))
    assert 0.035 <= alarms / 2000 <= 0.065


def test_one_repeat_gives_the_estimate_without_an_interval_and_never_significant():
    r = between_repeats([0.5])
    assert r.estimate == pytest.approx(-50) and not r.measured and not r.significant and r.clusters == 1
    text = describe(r, "TTFT p50")
    assert text == "TTFT p50 −50.0% (one repeat: run-to-run variation not measured)" and "significant" not in text
    assert between_repeats([]) is None and between_repeats([0.0, -1.0]) is None  # no positive ratio


def test_between_repeat_estimate_is_the_geometric_mean_and_the_interval_widens_with_the_spread():
    tight, loose = between_repeats([1.1, 1.1, 1.1]), between_repeats([1.0, 1.1, 1.21])
    assert tight.estimate == pytest.approx(10) and (tight.lo, tight.hi) == pytest.approx((10, 10))
    assert tight.significant and loose.estimate == pytest.approx(10) and loose.lo < 0 < loose.hi


def test_paired_latency_intervals_come_from_the_spread_between_repeats_not_from_the_requests():
    rng = np.random.default_rng(5)
    base = [rng.lognormal(-2, 0.5, 400) for _ in range(3)]
    done = np.ones(400, dtype=bool)
    speed = [0.6, 1.0, 1.5]  # what moves a whole run (the machine's speed that minute): 400 requests hide none of it
    runs_a = [run("dynamic", k, speed[k] * base[k], done) for k in range(3)]
    runs_b = [run("naive", k, base[k], done) for k in range(3)]
    spread = paired_latency(runs_a, runs_b, "ttft", 50)
    assert spread.clusters == 3 and spread.n_pairs == 1200 and not spread.significant
    assert spread.lo < -40 and spread.hi > 50
    one = paired_latency(runs_a[:1], runs_b[:1], "ttft", 50)
    assert one.estimate == pytest.approx(-40) and not one.measured and not one.significant
