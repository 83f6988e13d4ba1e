"""A twin's capacity confirmed live (lab/twin_confirm.py): the probe's verdict where it decides, else the twin's
prediction for the probe's own arrivals over the range one live run's speed falls in (lab.twin.speed_ranges)."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from batchlab.lab.sweep_plan import load_plan
from batchlab.lab.twin_confirm import Confirmation, TwinPrediction, nominal_for, predicted
from batchlab.protocol.verdicts import AgreedBy
from batchlab.stats.capacity import Probe
from batchlab.stats.verdict import Verdict
from tests.test_saturation import constant_step_config

def verdict(sustained: bool, judged: bool = True) -> Verdict:
    return Verdict(sustained, [] if sustained else ["undecided: the queue needs longer"], 1.0, 0.0, judged=judged)


def test_the_live_confirmation_agrees_disagrees_or_says_it_could_not_decide():
    assert Confirmation(Probe(5.0, verdict(True)), 20.0, 20.0).agrees is True
    failed = Confirmation(Probe(5.0, Verdict(False, ["served 91% < 99%"], 0.91, 0.4)), 20.0, 20.0)
    assert failed.agrees is False and "not sustained" in failed.text() and "served 91%" in failed.text()
    open_ = Confirmation(Probe(5.0, verdict(False, judged=False)), 540.0, 30.0)
    assert open_.agrees is None and "deciding there takes about 540 s" in open_.text()
    above = Confirmation(Probe(5.0, verdict(False, judged=False)), math.inf, 8.0)  # offered at or above the live μ
    assert above.agrees is None and "at or above the live μ: no length of traffic decides there" in above.text()
    assert "inf s" not in above.text()


def test_the_confirmation_asks_for_the_nominal_rate_whose_schedule_offers_the_target():
    cfg = SimpleNamespace(arrival="poisson", seed=0, burstiness=1.0)
    from batchlab.traffic.arrivals import arrival_offsets

    for target, duration_s in ((11.3, 30.0), (2.4, 20.0), (11.2, 4.0), (17.1, 4.0), (20.7, 4.0)):
        rate = nominal_for(target, duration_s, cfg)
        offered = np.count_nonzero(arrival_offsets("poisson", rate, duration_s, np.random.default_rng([0, 0]))
                                   <= duration_s) / duration_s
        assert target - 1 / duration_s < offered <= target  # at or just below it: within one arrival


def test_an_undecided_confirmation_is_decided_by_the_twins_prediction_for_its_arrivals():
    within = TwinPrediction(1.8, 1.5, 1.9, (0.87, 1.15), 0.95)
    above = TwinPrediction(2.56, 1.27, 2.08, (0.87, 1.15), 0.77)
    agreed = Confirmation(Probe(5.0, verdict(False, judged=False)), 540.0, 8.0, prediction=within)
    assert agreed.agrees is True and agreed.agreed_by is AgreedBy.PREDICTION
    assert "deciding there takes about 540 s" in agreed.text()
    assert "1.8 s is within the twin's 1.5–1.9 s" in agreed.text()
    assert "0.87–1.15× its speed" in agreed.text() and "ran at" not in agreed.text()
    slow = Confirmation(Probe(5.0, verdict(False, judged=False)), math.inf, 8.0, prediction=above)
    assert slow.agrees is False and slow.agreed_by is AgreedBy.PREDICTION  # a ⚠, with both figures
    assert "2.56 s is above the twin's 1.27–2.08 s" in slow.text() and "the probe ran at 0.77×" in slow.text()
    fast = TwinPrediction(0.9, 1.27, 2.08, (0.87, 1.15))
    assert not fast.within and "0.9 s is below the twin's" in fast.text()
    doc = slow.as_dict()
    assert doc["agrees"] is False and doc["agreed_by"] == "prediction" and doc["prediction"]["live_s"] == 2.56
    # a decided verdict stands, whatever the prediction; neither: undecided
    judged = Confirmation(Probe(5.0, Verdict(False, ["served 91% < 99%"], 0.91, 0.4)), 20.0, 20.0, prediction=within)
    assert judged.agrees is False and judged.agreed_by is AgreedBy.VERDICT
    assert judged.as_dict()["agreed_by"] == "verdict"
    sustained = Confirmation(Probe(5.0, verdict(True)), 20.0, 20.0, prediction=above)
    assert sustained.agrees is True and sustained.agreed_by is AgreedBy.VERDICT
    bare = Confirmation(Probe(5.0, verdict(False, judged=False)), 540.0, 8.0)
    assert bare.agrees is None and bare.agreed_by is None and bare.as_dict()["agreed_by"] is None


def test_a_narrow_speed_range_is_written_with_enough_digits_to_tell_its_ends_apart():
    assert "0.997–1.003× its speed" in TwinPrediction(0.52, 0.517, 0.525, (0.997, 1.003)).text()


def test_one_more_runs_speed_range_pools_every_strategys_spread_and_is_wider_than_the_means():
    """t·s·√(1 + 1/n) about the strategy's geometric mean, s pooled over every strategy's runs (Σ(n - 1) degrees of
    freedom); the mean's own interval (pooled_spreads) is the narrower t·s/√n; no degree of freedom, no range."""
    from batchlab.lab.twin import speed_ranges
    from batchlab.stats.intervals import t_quantile

    speeds = {"naive": [1.0, 0.9, 1.1, 1.0], "dynamic": [1.05, 0.95, 1.0], "vllm": [1.2]}
    ranges = speed_ranges(speeds)
    logs = {label: np.log(v) for label, v in speeds.items()}
    sd = math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in logs.values()) / 5)
    for label, v in logs.items():
        half = t_quantile(0.95, 5) * sd * math.sqrt(1 + 1 / len(v))
        assert ranges[label] == (pytest.approx(math.exp(v.mean() - half)), pytest.approx(math.exp(v.mean() + half)))
    assert ranges["vllm"][0] < 1.2 < ranges["vllm"][1]  # one run of its own: the others' spread about it
    assert speed_ranges({"naive": [1.0]}) == {} and speed_ranges({}) == {}


def test_the_twin_predicts_a_runs_e2e_at_the_speed_it_ran_and_not_at_a_slower_one(tmp_path):
    """A run on a constant-step model, its twin the same model 25% slower: played across 1.2-1.3× the twin's speed
    (the live run's 1.25× among them) the twin's range holds the run's E2E p50; across 0.9-1.1× every prediction is
    slower, and the run reads below it (its probe ran at 1.25×: said)."""
    from batchlab.lab.simulate import simulate_run
    from batchlab.lab.sweep_plan import Point
    from batchlab.lab.twin import at_speed, run_speed
    from batchlab.worker.stepmodel import load_preset

    plan = load_plan(constant_step_config(tmp_path, 4, 0.8, 12))
    entry = next(e for e in plan.entries if e.label == "naive")
    twin = at_speed(load_preset(plan.base["preset"]), 1 / 1.25, tmp_path / "twin.yaml")
    point = Point(entry, 3.0, 0, plan.seed, tmp_path / "probe")
    simulate_run(point.config({**plan.base, "duration_s": 8}))
    speed = run_speed(load_preset(twin), point.folder)
    fits = predicted(point.folder, twin, (1.2, 1.3), speed)
    assert fits.within and fits.lo_s < fits.hi_s and fits.speeds == (1.2, 1.3)
    assert fits.lo_s <= fits.live_s <= fits.hi_s and fits.speed == pytest.approx(1.25, rel=1e-6)
    slower = predicted(point.folder, twin, (0.9, 1.1), speed)
    assert not slower.within and slower.live_s < slower.lo_s and "below" in slower.text()
    assert "the probe ran at 1.25×" in slower.text()
    assert predicted(tmp_path, twin, (0.9, 1.1)) is None  # no schedule: nothing to play


def test_a_prediction_is_played_over_no_less_than_the_twin_searchs_width():
    from batchlab.lab.twin_confirm import judged_speeds

    lo, hi = judged_speeds((0.999, 1.001), 0.03)  # a sim worker's runs: its speed known to ±0.1%
    assert lo == pytest.approx(1 / 1.03, rel=1e-3) and hi == pytest.approx(1.03, rel=1e-3)
    assert judged_speeds((0.87, 1.15), 0.03) == (0.87, 1.15)  # a real machine's range is wider: as it is
    middle = math.sqrt(1.1 * 1.12)
    assert judged_speeds((1.1, 1.12), 0.03) == pytest.approx((middle / 1.03, middle * 1.03))


def test_a_disagreeing_confirmation_is_a_warning_with_the_twins_capacity_and_the_probes_figures():
    from batchlab.report.capacities import disagreement

    slow = Confirmation(Probe(3.9, verdict(False, judged=False)), 550.0, 8.0,
                        prediction=TwinPrediction(3.28, 2.46, 3.23, (0.84, 1.18), 0.81))
    doc = {"label": "naive", "estimate_req_s": 3.44, "lo_req_s": 3.15, "hi_req_s": 3.77,
           "confirmation": slow.as_dict()}
    (line,) = disagreement(doc)
    assert line.startswith("naive: the twin's capacity 3.44 [3.15, 3.77] req/s, but the live probe disagrees: "
                           "its E2E p50 3.28 s is above the twin's 2.46–3.23 s")
    assert "the probe ran at 0.81×" in line and "its verdict: undecided at λ = 3.9" in line
    agreeing = Confirmation(Probe(3.9, verdict(False, judged=False)), 550.0, 8.0,
                            prediction=TwinPrediction(3.0, 2.46, 3.23, (0.84, 1.18)))
    assert disagreement({**doc, "confirmation": agreeing.as_dict()}) == []


def test_a_probe_that_wrote_no_summary_has_no_prediction(tmp_path):
    (tmp_path / "schedule.parquet").write_bytes(b"")  # its schedule saved, then the run failed before its tables
    assert predicted(tmp_path, tmp_path / "twin.yaml", (0.9, 1.1)) is None
