"""The study's twin (lab.twin, lab.twin_curves) and the saturated phase that feeds it: a twin fitted to a
constant-step model's saturated runs finds the capacity a ten-times-longer search finds, repeats stop once every
throughput comparison is decided, μ's estimator is the tighter one, and the live confirmation's verdicts."""
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from batchlab.lab.capacity_search import SimulatedSearch, _saturated_point, measured, search_all
from batchlab.lab.saturated_repeats import comparisons, decided, saturate_all, saturation_record
from batchlab.lab.sweep_plan import Entry, load_plan
from batchlab.lab.twin import fit_twin, twin_capacity, widened
from batchlab.protocol.study_settings import AutoRates
from batchlab.stats.intervals import PairedResult
from batchlab.stats.saturation import BUSY, WINDOW, SaturatedRun, choose_estimator, pooled
from tests.test_saturation import constant_step_config


def saturated_folders(tmp_path, plan, label: str, repeats: int, duration_s: float) -> list[SaturatedRun]:
    """`repeats` saturated runs of the entry labelled `label`, simulated and written as a live run's folders."""
    from batchlab.lab.simulate import simulate_run

    entry = next(e for e in plan.entries if e.label == label)
    runs = []
    for k in range(repeats):
        point, base = _saturated_point(plan, entry, tmp_path, k, plan.auto, duration_s)
        simulate_run(point.config(base))
        runs.append(measured(point.folder, duration_s, k, str(point.folder.relative_to(tmp_path))))
    return runs


@pytest.mark.slow
def test_the_twin_of_a_constant_step_model_finds_what_a_ten_times_longer_search_finds(tmp_path):
    """μ = 11.94 req/s exactly, a queue limit of 16 (docs/capacity.md: 12 s probes cannot see the limit's
    refusals near μ, 600 s probes find capacity near 10.6). The twin, fitted to three 12 s saturated runs'
    steps, places capacity within 5% of the 600 s search's estimate, and the 12 s search's interval holds it."""
    plan = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, 12, max_queue=16))
    runs = saturated_folders(tmp_path, plan, "naive", 3, 12.0)
    fit = fit_twin(tmp_path, "naive", runs)
    assert fit.preset.is_file() and len(fit.folders) == 3
    cap, twin = twin_capacity(plan, fit, plan.auto)
    assert twin["saturated"]["req_s"] == pytest.approx(11.94, rel=0.02)
    assert len(twin["speed_ratios"]) == 3 and twin["bias_pct"] == pytest.approx(0.0, abs=1.0)  # its own steps
    assert twin["spread_pct"] == pytest.approx(0.0, abs=1.0)
    found = {}
    for probe_s in (12, 600):
        other = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, probe_s, max_queue=16))
        found[probe_s] = search_all(other, SimulatedSearch(other, other.auto), other.auto, ["naive"])["naive"]
    long_, short = found[600].as_dict(), found[12].as_dict()
    assert cap.estimate_req_s == pytest.approx(long_["estimate_req_s"], rel=0.05)
    assert short["lo_req_s"] <= cap.estimate_req_s <= short["hi_req_s"]
    doc = widened(cap.as_dict(), twin["spread_pct"])
    assert doc["lo_req_s"] <= doc["estimate_req_s"] <= doc["hi_req_s"]
    assert doc["hi_req_s"] / doc["lo_req_s"] < 1.3  # within ±15% of the estimate


def run(repeat: int, req_s: float, busy: float | None = None, half: float = 0.3) -> SaturatedRun:
    """A saturated run of `req_s` with a window interval ±half and, given `busy`, a tight busy-time μ."""
    r = SaturatedRun(repeat, req_s, req_s * (1 - half), req_s * (1 + half), 30 * req_s, 0.0, math.inf, [1.0, 9.0], 20)
    if busy is not None:
        r.busy = {"repeat": repeat, "req_s": busy, "req_s_lo": busy * 0.98, "req_s_hi": busy * 1.02,
                  "tok_s": 30 * busy, "tok_s_lo": 0.0, "tok_s_hi": math.inf, "window_s": [1.0, 9.0],
                  "completions": 20}
    return r


class Runner:
    """saturate_all's runner: each strategy's μ per repeat from a table, counting the runs asked for."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table, self.asked = table, []

    def saturated(self, entry, repeat):
        self.asked.append((entry.label, repeat))
        return run(repeat, self.table[entry.label][repeat])


def test_saturated_repeats_stop_once_every_throughput_comparison_is_decided():
    """Continuous is clearly faster and dynamic within ±10% of naive after 3 repeats: no 4th or 5th; a
    comparison whose interval straddles zero beyond ±10% takes every repeat up to the most."""
    settings = AutoRates(saturated_repeats=5, saturated_min_repeats=3, decided_pct=10)
    entries = [Entry(lb, {}) for lb in ("naive", "dynamic", "continuous")]
    clear = Runner({"naive": [3.0, 3.1, 2.9, 3.0, 3.0], "dynamic": [3.02, 3.08, 2.93, 3, 3],
                    "continuous": [5.0, 5.2, 4.8, 5, 5]})
    runs = saturate_all(SimpleNamespace(repeats=1), clear, entries, settings)
    assert {len(rs) for rs in runs.values()} == {3} and len(clear.asked) == 9
    record = saturation_record(runs, settings)
    assert record["repeats"] == 3 and all(c["decided"] for c in record["comparisons"].values())
    assert record["comparisons"]["continuous"]["repeats_needed"] == 2  # its interval excluded zero at 2 already
    noisy = Runner({"naive": [3.0, 3.0, 3.0, 3.0, 3.0], "dynamic": [2.0, 4.5, 2.2, 4.4, 3.0],
                    "continuous": [5.0, 5.2, 4.8, 5, 5]})
    runs = saturate_all(SimpleNamespace(repeats=1), noisy, entries, settings)
    assert {lb: len(rs) for lb, rs in runs.items()} == {"naive": 5, "dynamic": 5, "continuous": 3}  # only the open one
    record = saturation_record(runs, settings)
    dynamic = record["comparisons"]["dynamic"]
    assert not dynamic["decided"] and dynamic["repeats_needed"] is None


@pytest.mark.parametrize("lo, hi, expected", [(5.0, 40.0, True), (-6.0, 6.0, True), (-4.0, 25.0, False),
                                               (-30.0, -12.0, True), (-12.0, 3.0, False)])
def test_a_throughput_comparison_is_decided_when_it_excludes_zero_or_lies_within_the_margin(lo, hi, expected):
    result = PairedResult((lo + hi) / 2, lo, hi, 0, not lo <= 0 <= hi, 3)
    assert decided(result, 10.0) is expected
    assert not decided(PairedResult(5.0, math.nan, math.nan, 0, False, 1), 10.0)  # one repeat: no interval
    assert not decided(None, 10.0)


def test_mu_uses_the_busy_time_only_where_it_is_tighter_for_every_strategy():
    tight = {"a": [run(k, 3.0 + 0.3 * k, busy=3.0) for k in range(3)],
             "b": [run(k, 5.0 - 0.4 * k, busy=5.0) for k in range(3)]}
    assert choose_estimator(tight) == BUSY
    assert pooled([r.by(BUSY) for r in tight["a"]], BUSY)["req_s"] == pytest.approx(3.0)
    missing = {"a": tight["a"], "b": [run(k, 5.0) for k in range(3)]}  # b's runs have no busy time read
    assert choose_estimator(missing) == WINDOW
    wide = {"a": [run(k, 3.0, busy=3.0 + k) for k in range(3)]}  # the window's repeats agree, the busy ones do not
    assert choose_estimator(wide) == WINDOW
    assert comparisons({"naive": tight["a"], "b": tight["b"]})["b"].estimate == pytest.approx(5 / 3 * 100 - 100)


@pytest.mark.slow
def test_a_live_study_on_the_sim_backend_fits_a_twin_that_finds_the_long_searchs_capacity(tmp_path):
    """The same constant-step model served by live processes (the sim worker sleeps each step): the study's twin,
    fitted to its live saturated runs' steps, finds capacity within 5% of the 600 s virtual search's; the live
    probe at it is judged or said undecided, and capacity.json keeps the twin, the saturation record and the
    confirmation."""
    import json

    from batchlab import api

    config = constant_step_config(tmp_path, 4, 4 / 11.94, 12, max_queue=16)
    out = tmp_path / "study"
    api.capacity(config, out, strategies=["naive"], saturated_duration_s=6, saturated_min_repeats=3,
                 saturated_repeats=3, confirm_max_s=6)
    doc = json.loads((out / "capacity.json").read_text())
    naive = doc["strategies"]["naive"]
    assert doc["method"] == "twin" and doc["saturation"]["repeats"] == 3 and naive["method"] == "twin"
    long_plan = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, 600, max_queue=16))
    long_ = search_all(long_plan, SimulatedSearch(long_plan, long_plan.auto), long_plan.auto, ["naive"])["naive"]
    assert naive["estimate_req_s"] == pytest.approx(long_.estimate_req_s, rel=0.05)
    assert naive["lo_req_s"] <= naive["estimate_req_s"] <= naive["hi_req_s"]
    assert (out / "_twin" / "presets" / "naive.yaml").is_file()
    confirm = naive["confirmation"]
    assert confirm["ran_s"] <= 6 and naive["probes"][0]["live"]
    # undecided, the twin's prediction for the probe's own arrivals decides; the sim worker's steps are the model's,
    # so the live E2E p50 lies close to the twin's range (within it on a quiet machine)
    prediction = confirm["prediction"]
    assert prediction["lo_s"] <= prediction["hi_s"] and confirm["speed"] == pytest.approx(1.0, abs=0.2)
    if confirm["agreed_by"] == "prediction":
        assert confirm["agrees"] is (prediction["lo_s"] <= prediction["live_s"] <= prediction["hi_s"])
    else:
        assert confirm["agreed_by"] == "verdict" and confirm["agrees"] is confirm["sustained"]
    assert prediction["lo_s"] * 0.8 <= prediction["live_s"] <= prediction["hi_s"] * 1.25, prediction
    twin = naive["twin"]  # the confirmation is a fourth sample of the machine's speed against the twin
    assert len(twin["speed_ratios"]) == 4 and twin["speed_ratios"][-1] == twin["confirmation_speed"]


def test_terms_full_batches_cannot_tell_apart_are_fitted_in_the_priors_proportions():
    """Every decode step of 8 rows: a step's fixed cost and its cost per row are one number to the data. Tied in
    a prior's proportions (20 ms + 2 ms a row), the fit keeps the measured time of 8 rows and gives 1 row the
    prior's share of it, where an untied fit may put it all on the rows (1 row: an eighth of the time)."""
    import pandas as pd

    from batchlab.lab.calibrate import Constants
    from batchlab.lab.calibrate_runs import fit_runs, row_ties
    from batchlab.worker.stepmodel import StepModel

    rows = []
    t = 0.0
    for batch in range(20):
        prompt = 40 + 10 * (batch % 5)
        rows.append((t, t + 0.1 + 0.0005 * 8 * prompt, 0, 0, 8, 8 * prompt, 8 * prompt * prompt))
        t = rows[-1][1]
        for k in range(30):
            rows.append((t, t + 0.036 + 1e-5 * 8 * (prompt + k), 8, 8 * (prompt + k), 0, 0, 0))
            t = rows[-1][1]
    steps = pd.DataFrame(rows, columns=["start_s", "end_s", "decode_rows", "decode_context", "prefill_rows",
                                        "prefill_tokens", "prefill_pairs"])
    c = Constants(1e8, 1000, 1e10, True, False, 0)
    prior = StepModel("prior", 1e8, 1000, 0.0, 0.0005, overhead_s=0.020, decode_s_per_row=0.002)
    ties = row_ties(steps, prior)
    assert ties[0] == {"overhead_s": 0.020, "decode_s_per_row": 0.002}
    model, table = fit_runs(steps, "tied", "compute", c, ties=ties)
    assert model.decode_step_s(8 * 50, 8) == pytest.approx(0.036 + 1e-5 * 400, rel=0.05)
    assert model.overhead_s / model.decode_s_per_row == pytest.approx(10.0, rel=1e-6)
    assert model.decode_step_s(50, 1) == pytest.approx(0.036 * 22 / 36 + 1e-5 * 50, rel=0.05)


def test_the_twin_keeps_the_runs_total_step_time():
    """A fit 10% short in total (relative-error fits underweigh rare long steps) is scaled back: every time term
    × 1/0.9, the factor recorded; a fit with no total error is left as it is."""
    from batchlab.lab.twin import level
    from batchlab.worker.stepmodel import StepModel

    fitted = StepModel("t", 1e8, 1000, 0.0, 0.0005, overhead_s=0.02, decode_s_per_row=0.002,
                       prefill_overhead_s=0.05)
    model, record = level(fitted, {"total_time_error": -0.1})
    assert model.overhead_s == pytest.approx(0.02 / 0.9) and model.prefill_s_per_token == pytest.approx(0.0005 / 0.9)
    assert model.prefill_overhead_s == pytest.approx(0.05 / 0.9) and record["levelled_by"] == pytest.approx(1 / 0.9)
    assert model.decode_step_s(100, 4) == pytest.approx(fitted.decode_step_s(100, 4) / 0.9)
    assert level(fitted, {"total_time_error": 0.0}) == (fitted, {"total_time_error": 0.0})


@pytest.mark.parametrize("value, floored", [(2.4189, 2.41), (12.349, 12.3), (0.98765, 0.987), (3.0, 3.0)])
def test_a_rate_that_must_stay_at_or_below_its_source_is_rounded_down(value, floored):
    """The live grid's load (0.8 × the lowest capacity) and the confirmation's rate never round up past it."""
    from batchlab.lab.sweep import live_loads
    from batchlab.lab.sweep_order import floor_3g
    from batchlab.lab.twin_confirm import confirmation_rate

    assert floor_3g(value) == pytest.approx(floored) and floor_3g(value) <= value
    assert confirmation_rate({"estimate_req_s": value}) == pytest.approx(floored)
    assert live_loads([value / 0.8, 50.0], AutoRates(live_loads=[0.8])) == [pytest.approx(floor_3g(value))]


def test_the_twins_estimate_is_held_to_the_live_mu_only_where_the_live_runs_contradict_it():
    """A twin's long probes average more prompts than the live μ's short runs: its estimate stands anywhere within
    the live μ's 95% interval, and is held to the live μ (the interval's low end too, and the tok/s), as the live
    search's estimate is held to its μ, only above that interval's upper end."""
    from batchlab.lab.twin import held_to
    from batchlab.stats.capacity import CapacityEstimate

    cap = CapacityEstimate("naive", 9.9, 10.2, saturated={"req_s": 10.6, "req_s_hi": 10.9})  # estimate ≈ 10.05
    held, was = held_to(cap, {"req_s": 9.5, "req_s_lo": 9.2, "req_s_hi": 9.8})
    doc = held.as_dict()
    assert was and doc["estimate_req_s"] == 9.5 and doc["lo_req_s"] == 9.5 and doc["hi_req_s"] == 10.2
    within = {"req_s": 9.8, "req_s_lo": 8.0, "req_s_hi": 12.0}  # below the estimate, but its interval holds it
    assert held_to(cap, within) == (cap, False)
    assert held_to(cap, {"req_s": 9.8, "req_s_hi": math.inf}) == (cap, False)
    assert held_to(cap, {"req_s": 10.2, "req_s_hi": 10.5}) == (cap, False) and held_to(cap, None) == (cap, False)


def test_the_twins_speed_spread_is_pooled_over_every_strategys_runs():
    """The machine's speed against each twin in interleaved runs is one noise: its standard deviation is pooled over
    every strategy's runs (Σ(n - 1) degrees of freedom), each strategy's half-width t·s/√n on that, its own beside
    it; a lone strategy keeps its own, and a twin with one run takes the pooled one."""
    from batchlab.lab.twin import pooled_spreads, with_speeds
    from batchlab.stats.intervals import t_quantile

    speeds = {"naive": [1.0, 0.9, 1.1, 1.0], "dynamic": [1.05, 0.95, 1.0], "vllm": [1.0]}
    records = {label: with_speeds(r) for label, r in speeds.items()}
    own = {label: rec["spread_pct"] for label, rec in records.items()}
    pooled_spreads(records)
    logs = {label: np.log(r) for label, r in speeds.items()}
    ss = sum(float(((v - v.mean()) ** 2).sum()) for v in logs.values())
    sd, df = math.sqrt(ss / 5), 5
    for label, v in logs.items():
        half = t_quantile(0.95, df) * sd / math.sqrt(len(v))
        assert records[label]["spread_pct"] == pytest.approx((math.exp(half) - 1) * 100)
        assert records[label]["own_spread_pct"] == own[label] and records[label]["spread_df"] == df
    assert records["naive"]["spread_pct"] < own["naive"]  # t on 5 degrees of freedom, not 3
    alone = {"naive": with_speeds([1.0, 0.9, 1.1])}
    mine = alone["naive"]["spread_pct"]
    pooled_spreads(alone)
    assert alone["naive"]["spread_pct"] == pytest.approx(mine)
    nothing = {"naive": with_speeds([1.0])}
    pooled_spreads(nothing)
    assert nothing["naive"]["spread_pct"] is None and "spread_df" not in nothing["naive"]


def test_a_live_point_replayed_at_its_own_speed_leaves_only_the_models_error(tmp_path):
    """Two repeats of a point run on a constant-step model; their twin is the same model 25% slower. As the twin
    predicts each run, E2E is longer (its steps 25%, the wait for a full batch not); each run's speed reads 1.25
    (the twin's time for its steps ÷ theirs), and replayed at that speed, each rate's repeats pooled, the model's
    error is nil."""
    from batchlab.lab.simulate import simulate_run
    from batchlab.lab.sweep_plan import Point
    from batchlab.lab.twin import at_speed, run_speed
    from batchlab.lab.twin_curves import twin_errors
    from batchlab.protocol.outcomes import RunOutcome
    from batchlab.worker.stepmodel import load_preset

    plan = load_plan(constant_step_config(tmp_path, 4, 0.8, 12))
    entry = next(e for e in plan.entries if e.label == "naive")
    live = load_preset(plan.base["preset"])
    twin = at_speed(live, 1 / 1.25, tmp_path / "twin.yaml")  # every step 25% longer than the live runs'
    points = []
    for repeat in range(2):
        point = Point(entry, 3.0, repeat, plan.seed, tmp_path / f"sweep_label=naive/sweep_rate=3/sweep_repeat={repeat}")
        simulate_run(point.config({**plan.base, "duration_s": 8}))
        points.append({"label": "naive", "rate": 3.0, "repeat": repeat, "status": RunOutcome.DONE,
                       "dir": str(point.folder.relative_to(tmp_path))})
        assert run_speed(load_preset(twin), point.folder) == pytest.approx(1.25, rel=1e-6)
    capacity = {"strategies": {"naive": {"twin": {"preset": str(twin)}, "estimate_req_s": 4.5}}}
    doc = twin_errors(tmp_path, {"points": points}, capacity)
    assert all(p["error"]["e2e_p50"] > 0.1 for p in doc["points"]), doc["points"]
    assert [p["speed"] for p in doc["points"]] == [pytest.approx(1.25, rel=1e-6)] * 2
    (rate,) = doc["rates"]
    assert rate["repeats"] == 2 and rate["rho"] == pytest.approx(3.0 / 4.5)
    assert all(abs(e) < 1e-6 for e in rate["error"].values()), rate
    model = doc["strategies"]["naive"]["model"]["low"]
    assert model["e2e_p50"] == {"median": pytest.approx(0.0, abs=1e-6), "worst": pytest.approx(0.0, abs=1e-6),
                                "points": 1}
    assert doc["strategies"]["naive"]["low"]["e2e_p50"]["median"] > 0.1
    assert doc["repeats"] == [{"repeat": r, "speeds": {"naive": pytest.approx(1.25, rel=1e-6)},
                               "mean": pytest.approx(1.25, rel=1e-6)} for r in (0, 1)]


def test_the_machines_speed_in_each_repeat_is_every_strategys_geometric_mean_and_is_stated():
    """A drift shared by every strategy, repeat by repeat (make run's 0.80 → 1.10 over its grid), is the machine's:
    errors.json keeps it per repeat, the terminal gives the means, the report a table."""
    from batchlab.lab.twin_curves import error_lines, speeds_by_repeat
    from batchlab.report.twin import Twin, section

    rows = [{"label": label, "repeat": repeat, "speed": speed} for repeat, speeds in enumerate(
        [{"naive": 0.8, "vllm": 0.82}, {"naive": 1.1, "vllm": None}]) for label, speed in speeds.items()]
    rows.append({"label": "naive", "repeat": 0, "speed": 0.5})  # the repeat's second rate: its first run stands
    repeats = speeds_by_repeat(rows)
    assert [r["repeat"] for r in repeats] == [0, 1] and repeats[1]["speeds"] == {"naive": 1.1}
    assert repeats[0]["speeds"] == {"naive": 0.8, "vllm": 0.82}
    assert repeats[0]["mean"] == pytest.approx(math.sqrt(0.8 * 0.82)) and repeats[1]["mean"] == pytest.approx(1.1)
    doc = {"rho_max": 0.8, "points": [], "strategies": {}, "repeats": repeats}
    assert error_lines(doc)[-1].endswith("by repeat (geometric mean over the strategies): 0: 0.81, 1: 1.10")
    assert not any("by repeat" in line for line in error_lines({**doc, "repeats": repeats[:1]}))
    capacity = {"naive": {"twin": {"saturated": {"req_s": 3.7}}, "saturated": {"req_s": 3.0}}}
    text = "\n".join(section(Twin(capacity, errors=doc)))
    assert "| 0 | 0.800 | 0.820 | 0.810 |" in text and "| 1 | 1.100 | — | 1.100 |" in text


def test_the_report_states_the_models_error_beside_the_twins_prediction_and_reads_older_folders():
    """REPORT.md's twin table: the model's error (rates) · as predicted (runs); a folder from before shows the
    second alone, and the per-rate table appears only where errors.json has rates."""
    from batchlab.report.twin import Twin, section

    stats = {"median": 0.28, "worst": 0.5, "points": 4}
    capacity = {"naive": {"twin": {"saturated": {"req_s": 3.7}, "total_time_error": -0.003, "spread_pct": 8.0},
                          "saturated": {"req_s": 3.0}, "estimate_req_s": 3.0, "lo_req_s": 2.8, "hi_req_s": 3.4}}
    figures = {"ttft_p50": 1.0, "e2e_p50": 2.0, "throughput": 50.0}
    rate = {"label": "naive", "rate": 2.4, "repeats": 4, "rho": 0.8, "live": figures, "twin": figures,
            "error": {k: 0.0 for k in figures}}
    new = {"rho_max": 0.8, "points": [], "rates": [rate], "strategies": {"naive": {
        "low": {k: stats for k in figures}, "all": {},
        "model": {"low": {k: {"median": 0.05, "worst": 0.05, "points": 1} for k in figures}}}}}
    text = "\n".join(section(Twin(capacity, errors=new)))
    assert "| 5% / 5% (1) · 28% / 50% (4) |" in text and "| naive | 2.4 | 4 | 0.80 | 1000 / 1000 (+0%) |" in text
    old = {"rho_max": 0.8, "points": [], "strategies": {"naive": {"low": {k: stats for k in figures}, "all": {}}}}
    text = "\n".join(section(Twin(capacity, errors=old)))
    assert "| 28% / 50% (4) |" in text and "·" not in text.split("## The twin")[1].split("\n\n", 2)[2]
    assert "repeats pooled (TTFT" not in text


def test_the_report_and_terminal_give_the_pooled_spread_with_the_strategys_own_and_a_held_twin_with_both_figures():
    from batchlab.lab.capacity_study import twin_line
    from batchlab.report.twin import Twin, twin_rows

    twin = {"saturated": {"req_s": 3.7}, "spread_pct": 8.0, "own_spread_pct": 13.2, "bias_pct": 0.5,
            "speed_ratios": [1.0, 0.9, 1.1, 1.0], "search": {"estimate_req_s": 3.6}}
    doc = {"twin": twin, "saturated": {"req_s": 3.0, "req_s_lo": 2.8, "req_s_hi": 3.2}, "estimate_req_s": 3.0,
           "lo_req_s": 2.8, "hi_req_s": 3.2}
    [row] = twin_rows(Twin({"naive": doc}))
    assert row[3] == "3 [2.8, 3.2] ± 8.0% (its own runs ± 13.2%)"
    line = twin_line("naive", doc)
    assert "± 8.0%" in line and "pooled over every twin's runs, its own 13.2%" in line and "⚠" not in line
    held = {**doc, "held_to_live_mu": True}
    [row] = twin_rows(Twin({"naive": held}))
    assert row[3].endswith("⚠ held to the live μ (the twin's 3.6 is above its interval)")
    assert "⚠ held to the live μ: the twin's estimate 3.6 req/s is above the live μ's interval [2.8, 3.2]" in (
        twin_line("naive", held))


@pytest.mark.slow
def test_every_strategys_twin_is_played_in_a_process_of_its_own_and_answers_as_played_alone(tmp_path, monkeypatch):
    from batchlab.lab import capacity_study
    from batchlab.lab.fanout import Fanout

    plan = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, 12, max_queue=16))
    runs = {label: saturated_folders(tmp_path, plan, label, 2, 6.0) for label in ("naive", "dynamic")}
    asked, fan_out = [], Fanout.map
    monkeypatch.setattr(Fanout, "map", lambda self, *args: asked.append(self.processes) or fan_out(self, *args))
    played = capacity_study.played_twins(plan, tmp_path, plan.entries, runs, plan.auto)
    assert asked == [0] and sorted(played) == ["dynamic", "naive"]  # Fanout: 0 processes, one per core
    for label, (fit, cap, record) in played.items():
        _, alone_cap, alone_record = capacity_study._played_twin((plan, tmp_path, plan.auto), (label, runs[label]))
        assert (cap, record) == (alone_cap, alone_record), label
        assert fit.preset.is_file() and fit.label == label


def test_the_twins_curves_are_played_on_every_core(tmp_path, monkeypatch):
    from dataclasses import replace

    from batchlab.lab.fanout import Fanout
    from batchlab.lab.twin_curves import play_curves

    plan = load_plan(constant_step_config(tmp_path, 4, 4 / 11.94, 12))
    plan = replace(plan, base={**plan.base, "duration_s": 5}, auto=plan.auto.model_copy(update={"points": 2}))
    preset = plan.base["preset"]
    capacity = {"strategies": {lb: {"estimate_req_s": 10.0, "twin": {"preset": preset}} for lb in ("naive", "dynamic")}}
    asked, fan_out = [], Fanout.map
    monkeypatch.setattr(Fanout, "map", lambda self, *args: asked.append(self.processes) or fan_out(self, *args))
    folder = play_curves(plan, tmp_path, capacity)
    assert asked == [0]  # Fanout: 0 processes, one per core
    assert len(list(folder.glob("*/*/*/summary.json"))) == 2 * 2 * 2  # strategies × rates × seeds
    # the report's curves, read from the requests tables alone, are the full reader's p50s over both seeds
    from batchlab.report.points import load_collection
    from batchlab.report.stats import all_stats
    from batchlab.report.twin import load_curves, load_twin

    full = all_stats(load_collection(folder))
    curves = load_curves(folder)
    assert set(curves) == set(full) and len(curves) == 2 * 2
    for key, stats in full.items():
        full_p50 = {f"{m}_p50": pytest.approx(stats.latency[m]["p50"], rel=1e-12) for m in ("ttft", "e2e")}
        assert curves[key].p50 == full_p50
    assert load_twin(tmp_path, capacity["strategies"]).curves == curves


def test_the_twins_that_step_every_step_are_searched_first():
    from batchlab.lab.capacity_study import longest_first

    plan = load_plan(Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml")
    assert [e.label for e in plan.entries] == ["naive", "dynamic", "continuous"]
    assert [e.label for e in longest_first(plan, plan.entries)] == ["continuous", "naive", "dynamic"]


def test_the_twins_widened_interval_never_reaches_above_the_live_mus_upper_bound():
    """Widened by the twin's speed spread, the top stops at the live μ's upper bound (no rate above it is
    sustained: a spread from a busy neighbour once put it at 10.16 over a bound of 10.02), never below the
    estimate; the low end widens as before, and tok/s follows req/s."""
    doc = {"lo_req_s": 9.0, "hi_req_s": 9.8, "estimate_req_s": 9.4, "lo_tok_s": 90.0, "hi_tok_s": 98.0}
    free = widened(doc, 5.0)
    assert free["hi_req_s"] == pytest.approx(9.8 * 1.05) and free["lo_req_s"] == pytest.approx(9.0 / 1.05)
    held = widened(doc, 5.0, ceiling_req_s=10.0)
    assert held["hi_req_s"] == pytest.approx(10.0) and held["hi_tok_s"] == pytest.approx(100.0)
    assert held["lo_req_s"] == pytest.approx(9.0 / 1.05)
    assert widened(doc, 5.0, ceiling_req_s=9.0)["hi_req_s"] == pytest.approx(9.4)  # not below the estimate
