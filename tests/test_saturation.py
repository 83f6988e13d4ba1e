"""The saturated rate μ and the capacity bounded by it: the batch-means interval's coverage on series whose
mean is known, μ read exactly from a worker that ends B requests every T s, the verdict on an overloaded
probe, and the search in the simulator against a constant-step model whose μ = B / T is known exactly."""
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from batchlab.lab.capacity_search import SimulatedSearch, search_all
from batchlab.lab.sweep_plan import load_plan
from batchlab.stats.saturation import SaturatedRun, batch_means, pooled, saturated_run
from batchlab.stats.verdict import Verdict, sustain

OUT = 6  # output tokens of every request


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """A stationary AR(1) series with mean 0."""
    noise = rng.normal(size=n)
    x = np.empty(n)
    x[0] = noise[0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return x


@pytest.mark.parametrize("phi", [0.0, 0.7])
def test_the_batch_means_interval_covers_the_true_mean_about_95_percent_of_the_time(phi):
    rng = np.random.default_rng(7)
    covered = [lo <= 0 <= hi for _, lo, hi in (batch_means(ar1(rng, 2000, phi)) for _ in range(400))]
    assert 0.90 <= np.mean(covered) <= 0.99


def test_the_naive_interval_of_an_autocorrelated_series_would_be_far_too_narrow():
    # what batch means protects against: 2000 points of AR(1) at 0.9 hold far less than 2000 points' evidence
    rng = np.random.default_rng(3)
    x = ar1(rng, 2000, 0.9)
    _, lo, hi = batch_means(x)
    assert (hi - lo) / 2 > 3 * 1.96 * x.std(ddof=1) / math.sqrt(x.size)


def static_batches(batch: int, step_s: float, until_s: float, jitter_s: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """A saturated worker's requests table: `batch` requests end together every step_s s."""
    rng = np.random.default_rng(seed)
    ends = np.cumsum(step_s + rng.uniform(-jitter_s, jitter_s, int(until_s / step_s)))
    times = np.repeat(ends[ends <= until_s], batch)
    return pd.DataFrame({"status": "finished", "completion_time": times, "n_tokens": OUT})


@pytest.mark.parametrize("batch, step_s", [(1, 1.0), (4, 0.8), (8, 0.16)])
def test_a_worker_that_ends_b_requests_every_t_seconds_reads_b_over_t(batch, step_s):
    run = saturated_run(static_batches(batch, step_s, 40.0), 30.0, repeat=2, folder="f")
    assert run.req_s == pytest.approx(batch / step_s) and run.tok_s == pytest.approx(OUT * batch / step_s)
    assert run.req_s_lo == pytest.approx(run.req_s) and run.req_s_hi == pytest.approx(run.req_s)
    assert 7.5 <= run.window_s[0] < 7.5 + step_s and 30.0 - step_s < run.window_s[1] <= 30.0  # warm-up, drain out
    assert (run.repeat, run.folder) == (2, "f")


def test_a_jittery_worker_gets_an_interval_around_its_rate():
    run = saturated_run(static_batches(8, 0.2, 60.0, jitter_s=0.1, seed=1), 60.0)
    assert run.req_s_lo < run.req_s < run.req_s_hi and run.req_s == pytest.approx(40.0, rel=0.05)
    assert run.req_s_hi - run.req_s_lo < 0.2 * run.req_s


def _runs(rates: list[float]) -> list[SaturatedRun]:
    return [SaturatedRun(r, v, v - 0.1, v + 0.1, 10 * v, 10 * v - 1, 10 * v + 1, [1.0, 9.0], 40)
            for r, v in enumerate(rates)]


def test_mu_pools_repeats_by_their_spread_on_the_log_scale_and_one_run_by_its_own_interval():
    runs = _runs([4.0, 5.0, 6.0])
    three = pooled(runs)
    logs = np.log([4.0, 5.0, 6.0])
    half = 4.303 * logs.std(ddof=1) / math.sqrt(3)  # t(0.975, 2) on the logs
    assert three["req_s"] == pytest.approx(math.exp(logs.mean()))  # the geometric mean
    assert three["req_s_hi"] == pytest.approx(math.exp(logs.mean() + half), rel=1e-4)
    assert three["req_s_lo"] * three["req_s_hi"] == pytest.approx(three["req_s"] ** 2)  # symmetric in ratio
    assert three["tok_s_lo"] == pytest.approx(10 * three["req_s_lo"], rel=1e-6) and "3 repeats" in three["method"]
    one = pooled(runs[:1])
    assert (one["req_s"], one["req_s_lo"], one["req_s_hi"]) == (4.0, 3.9, 4.1) and "not measured" in one["method"]
    assert [r["repeat"] for r in three["runs"]] == [0, 1, 2] and pooled([]) is None


def test_mu_s_interval_never_reaches_below_zero_however_far_apart_the_repeats():
    # make run beside other work read dynamic's repeats 1.16, 3.9 and 5.3 req/s: a t-interval on the rates
    # themselves went to −1.48; a rate is never negative, and a 4.6× spread reads as a wide ratio instead
    wide = pooled(_runs([1.16, 3.9, 5.3]))
    assert 0 < wide["req_s_lo"] < wide["req_s"] < wide["req_s_hi"] and wide["tok_s_lo"] > 0
    run = saturated_run(static_batches(8, 1.0, 12.0, jitter_s=0.9, seed=4), 12.0)  # few, very uneven batches
    assert run is not None and 0 < run.req_s_lo <= run.req_s <= run.req_s_hi


def queue_table(arrived: int, served_req_s: float, duration_s: float, seed: int = 0) -> pd.DataFrame:
    """`arrived` Poisson arrivals within duration_s (uniform given their count); a worker that launches the
    oldest waiting request every 1 / served_req_s s while one waits (FIFO; the queue drains after)."""
    arrivals = np.sort(np.random.default_rng(seed).uniform(0, duration_s, arrived))
    launches = np.maximum.accumulate(np.maximum(arrivals, arrivals[0] + np.arange(arrived) / served_req_s))
    return pd.DataFrame({"arrival_time": arrivals, "scheduled_time": launches, "completion_time": launches + 0.2,
                         "status": "finished", "error": "", "submitted": True, "n_tokens": 4})


@pytest.mark.parametrize("seed", range(5))
def test_an_overloaded_probe_whose_queue_grows_by_a_dozen_in_12_s_is_not_sustained(seed):
    # offered 5.25 req/s (63 in 12 s), launched 4.0/s: the queue gains about 14; the fixed tolerance of
    # 4 requests over the second half let this pass
    verdict = sustain(queue_table(63, 4.0, 12.0, seed), 12.0)
    assert verdict.offered_req_s == pytest.approx(5.25) and verdict.served_share == 1.0
    assert not verdict.sustained and "queue grew" in verdict.reasons[0]


@pytest.mark.parametrize("seed", range(5))
def test_a_rate_above_the_saturated_rates_interval_is_not_sustained_however_short_the_probe(seed):
    # served 4.6/s: 12 s cannot show its queue's growth of 0.65/s for sure; μ measured at 4.6 [4.3, 4.9] can
    verdict = sustain(queue_table(63, 4.6, 12.0, seed), 12.0, ceiling_req_s=4.9)
    assert not verdict.sustained and any("saturated rate" in r for r in verdict.reasons)


@pytest.mark.parametrize("seed", range(5))
def test_a_queue_that_keeps_up_near_its_limit_is_sustained(seed):
    verdict = sustain(queue_table(48, 4.6, 12.0, seed), 12.0, ceiling_req_s=4.9)  # offered 4.0 req/s
    assert verdict.sustained and verdict.queue_growth_lo < 0.05 * 4.0


def constant_step_config(tmp_path, batch: int, step_s: float, probe_s: float, max_queue: int = 0) -> str:
    """A sweep YAML on the sim backend: a static batch of `batch` takes step_s whatever its shape (half
    prefill, the rest OUT − 1 decode steps), so μ = batch / step_s; arrivals beyond `max_queue` waiting are
    refused (0: none)."""
    preset = tmp_path / f"const-{batch}.yaml"
    preset.write_text(yaml.safe_dump({"name": "const", "weights_bytes": 0, "kv_bytes_per_token": 0,
                                      "bandwidth_Bps": 0, "prefill_s_per_token": 0, "memory_bytes": 1e12,
                                      "prefill_overhead_s": step_s / 2, "overhead_s": step_s / 2 / (OUT - 1)}))
    config = tmp_path / f"const-{batch}-{probe_s}-{max_queue}.yaml"
    config.write_text(
        f"base: {{backend: sim, preset: {preset}, dataset: synthetic, prompt_lengths: 16, output_lengths: {OUT}, "
        f"max_new_tokens: {OUT}, batch_size: {batch}, max_batch_size: {batch}, warmup_requests: 0, "
        f"max_queue: {max_queue}}}\n"
        f"grid: {{strategies: [naive, dynamic], rates: {{auto: {{search_duration_s: {probe_s}}}}}}}\n")
    return str(config)


@pytest.mark.slow
@pytest.mark.parametrize("probe_s", [12, 60])
@pytest.mark.parametrize("batch, step_s", [(1, 1.0), (4, 0.8), (8, 0.16)])  # μ = 1, 5 and 50 req/s
def test_mu_and_capacity_meet_a_constant_step_models_known_maximum(tmp_path, batch, step_s, probe_s):
    mu = batch / step_s
    plan = load_plan(constant_step_config(tmp_path, batch, step_s, probe_s))
    for label, cap in search_all(plan, SimulatedSearch(plan, plan.auto), plan.auto).items():
        doc = cap.as_dict()
        assert doc["saturated"]["req_s"] == pytest.approx(mu, rel=0.02), label
        assert doc["saturated"]["tok_s"] == pytest.approx(OUT * mu, rel=0.02), label
        assert 0.95 * mu <= doc["estimate_req_s"] <= mu * (1 + 1e-9), (label, doc["probes"])
        assert doc["lo_req_s"] <= doc["estimate_req_s"] <= doc["hi_req_s"] <= mu * (1 + 1e-9)


@pytest.mark.slow
def test_a_short_searchs_interval_holds_what_a_ten_times_longer_one_finds(tmp_path):
    """μ = 11.94 req/s exactly, a queue limit of 16: near μ the queue's climbs to the limit are rare and slow,
    so a 12 s probe sees none (it read 11.9 [11.9, 11.9] before), while 600 s probes find capacity near 10.7.
    The short search must say what it could not see: its interval holds the long one's estimate, and the
    rates whose queue needed longer than the probe to settle read as undecided, not sustained."""
    found = {}
    for probe_s in (12, 600):
        plan = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, probe_s, max_queue=16))
        found[probe_s] = search_all(plan, SimulatedSearch(plan, plan.auto), plan.auto, ["naive"])["naive"].as_dict()
    short, long_ = found[12], found[600]
    assert short["saturated"]["req_s"] == pytest.approx(11.94, rel=0.01)
    assert long_["estimate_req_s"] < 0.95 * 11.94  # the long probes saw the limit's refusals
    assert short["lo_req_s"] <= long_["estimate_req_s"] <= short["hi_req_s"]
    assert any(not p["judged"] and "settle" in p["reasons"][0] for p in short["probes"])
    assert all(p["judged"] for p in long_["probes"] if p["rate_req_s"] < 0.9 * 11.94)


def test_a_verdict_from_too_few_requests_says_so_instead_of_sustained():
    verdict = sustain(queue_table(12, 8.0, 3.0), 3.0)  # 12 arrivals in 3 s, 9 of them after the warm-up
    assert not verdict.sustained and not verdict.judged and "too few requests" in verdict.reasons[0]
    assert verdict.mark == "?" and not verdict.failed


def test_the_report_warns_when_capacity_exceeds_what_the_same_sweep_completed():
    from batchlab.report.capacities import capacity_text, checks

    # the grid's points: at λ 8.57 the worker completed about 4.6/s at steady state (63 would be 5.25 in 12 s)
    runs = [(8.57, queue_table(103, 4.6, 12.0), 12.0), (2.0, queue_table(24, 4.6, 12.0), 12.0)]
    grew = Verdict(False, ["the queue grew"], 0.6, 3.9)
    verdicts = {8.57: [grew], 2.0: [Verdict(True, [], 1.0, 0.0)]}
    searched = {"label": "dynamic", "estimate_req_s": 5.57, "lo_req_s": 5.25, "hi_req_s": 5.92}
    [overloaded] = checks(searched, runs, verdicts)
    assert "above what it completed at steady state when overloaded (λ = 8.57" in overloaded
    # the same completions at a rate the sweep could not judge (a short run whose queue lagged a burst: make
    # run's dynamic at λ 2.97 offered 3.38 and completed 2.6 [2.56, 2.65] in its window, 27 of 27 finished)
    lagged = {8.57: [Verdict(False, ["undecided: the queue needs longer to settle"], 1.0, 0.0, judged=False)]}
    assert checks(searched, runs, lagged) == [] and checks(searched, runs) == []
    sat = {"req_s": 4.6, "req_s_lo": 4.5, "req_s_hi": 4.7, "tok_s": 18.4, "tok_s_lo": 18.0, "tok_s_hi": 18.8}
    assert checks({**searched, "estimate_req_s": 4.5, "saturated": sat}, runs, verdicts) == []
    slow_mu = {**sat, "req_s": 3.0, "req_s_lo": 2.9, "req_s_hi": 3.1}
    notes = checks({**searched, "estimate_req_s": 2.9, "saturated": slow_mu}, runs, verdicts)
    assert len(notes) == 1 and "above its saturated rate μ = 3 [2.9, 3.1]" in notes[0]
    above = {**searched, "saturated": sat, "checks": checks({**searched, "saturated": sat}, runs, verdicts)}
    text = capacity_text({"dynamic": above})
    assert text[1].split()[:3] == ["dynamic", "5.57", "[5.25,"] and "4.6 [4.5, 4.7]" in text[1]
    assert any(line.startswith("⚠ dynamic: capacity 5.57 req/s is above its saturated rate") for line in text)


def test_the_report_warns_when_a_capacity_sits_below_a_rate_the_same_sweep_sustained():
    """The check runs both ways: make run beside other work read naive '< 1.98 (no rate sustained)' while its
    grid point at 3.69 req/s finished 39 of 39 with the queue flat."""
    from types import SimpleNamespace

    from batchlab.report.capacities import checks, grid_verdicts

    def run(rate: float, arrived: int) -> SimpleNamespace:
        return SimpleNamespace(rate=rate, requests=queue_table(arrived, 20.0, 12.0), label="naive",
                               settings={"duration_s": 12.0, "max_queue": 16, "arrival": "poisson"})

    runs = [run(3.69, 44), run(1.0, 12)]
    missing = {"label": "naive", "hi_req_s": 1.98}  # every probe failed or could not tell
    [note] = checks(missing, [], grid_verdicts(runs))
    assert "capacity < 1.98 (no rate sustained) req/s is below λ = 3.69 (3.67 offered)" in note
    assert "which the same sweep sustained (100% served, the queue flat, 1 repeat(s))" in note
    assert checks({"label": "naive", "estimate_req_s": 4.2}, [], grid_verdicts(runs)) == []
    # judged as the search judges: with μ = 4 and a queue limit, 3.69 is too close to μ for 12 s to tell
    mu = {"req_s": 4.0, "req_s_lo": 3.9, "req_s_hi": 4.1}
    assert checks(missing, [], grid_verdicts(runs, saturated=mu)) == []


def test_a_repeats_note_shows_its_own_interval_only_where_it_says_something():
    from batchlab.lab.capacity_search import _own_interval
    from batchlab.stats.saturation import SaturatedRun

    def run(lo: float, hi: float) -> SaturatedRun:
        return SaturatedRun(0, 4.0, lo, hi, 120.0, 100.0, 140.0, [1.0, 9.0], 30)

    assert _own_interval(run(3.5, 4.6)) == "[3.5, 4.6] "
    # three batch means on a busy machine: [0.000113, 1.41e+05] req/s once; the figures say nothing
    assert "too few batches" in _own_interval(run(0.000113, 1.41e5))
    assert "too few batches" in _own_interval(run(0.0, 9.0))
