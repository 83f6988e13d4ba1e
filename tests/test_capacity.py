"""Capacity: the sustain verdict on hand-made tables, the bracketing search against a known threshold, and
the search in the simulator finding the capacity queueing theory predicts for a fixed service time."""
import math

import numpy as np
import pandas as pd
import pytest

from batchlab.lab.capacity_search import SimulatedSearch, search_all
from batchlab.lab.rate_search import next_rate, search
from batchlab.lab.sweep_plan import AutoRates, SweepError, load_plan
from batchlab.lab.sweep_order import span_rates
from batchlab.protocol.status import FailureReason
from batchlab.stats.capacity import Probe, bracket, from_runs
from batchlab.stats.verdict import Verdict, sustain, waiting

NO_TERMINAL = FailureReason.NO_TERMINAL

# naive, batch size 1, a step model whose prefill costs PREFILL_S and each decode step DECODE_S whatever the
# shape: every request takes PREFILL_S + (OUT − 1) × DECODE_S, so one worker serves 1 / that req/s (M/D/1)
PREFILL_S, DECODE_S, OUT = 0.05, 0.01, 6
SERVICE_S = PREFILL_S + (OUT - 1) * DECODE_S
FIXED_PRESET = {"name": "fixed", "weights_bytes": 0, "kv_bytes_per_token": 0, "bandwidth_Bps": 0,
                "prefill_s_per_token": 0, "overhead_s": DECODE_S, "prefill_overhead_s": PREFILL_S,
                "memory_bytes": 1e12}


def fixed_service_config(tmp_path, duration_s: float, prefill_s: float = PREFILL_S) -> str:
    """A sweep YAML on the sim backend with a fixed per-request service time (prefill_s + (OUT − 1) × DECODE_S)."""
    import yaml

    preset = tmp_path / "fixed.yaml"
    preset.write_text(yaml.safe_dump(FIXED_PRESET | {"prefill_overhead_s": prefill_s}))
    config = tmp_path / "fixed-sweep.yaml"
    search = f"{{search_duration_s: {duration_s}, width: 0.04, max_probes: 12}}"
    config.write_text(
        f"base: {{backend: sim, preset: {preset}, dataset: synthetic, prompt_lengths: 16, output_lengths: {OUT}, "
        f"max_new_tokens: {OUT}, batch_size: 1, max_batch_size: 1, duration_s: 4, warmup_requests: 0}}\n"
        f"grid: {{strategies: [naive], rates: {{auto: {search}}}}}\n")
    return str(config)


def requests_table(arrivals, launches, status=None, error=None) -> pd.DataFrame:
    n = len(arrivals)
    launches = np.asarray(launches, dtype=float)
    status = status or ["finished" if not math.isnan(t) else "failed" for t in launches]
    return pd.DataFrame({"request_id": range(n), "arrival_time": arrivals, "scheduled_time": launches,
                         "status": status, "error": error or [""] * n, "submitted": [True] * n,
                         "n_tokens": [4] * n, "output_len": [4] * n, "first_token_time": launches + 0.1,
                         "completion_time": launches + 0.2})


def test_a_queue_that_keeps_up_is_sustained():
    arrivals = np.arange(0, 20, 0.5)
    verdict = sustain(requests_table(arrivals, arrivals + 0.1), 20.0)
    assert verdict.sustained and verdict.reasons == [] and verdict.served_share == 1.0


def test_a_queue_that_grows_is_not_sustained_even_when_all_finish():
    arrivals = np.arange(0, 20, 0.1)  # 10 req/s offered, 5 req/s served: the queue gains 5 a second
    launches = np.arange(len(arrivals)) * 0.2
    verdict = sustain(requests_table(arrivals, launches), 20.0)
    assert not verdict.sustained and verdict.served_share == 1.0
    assert verdict.queue_growth == pytest.approx(5, rel=0.1) and "queue grew" in verdict.reasons[0]


def test_rejected_requests_leave_the_queue_but_fail_the_served_share():
    arrivals = np.arange(0, 20, 0.1)
    launches = [t + 0.05 if i % 10 else math.nan for i, t in enumerate(arrivals)]  # every 10th: queue full
    table = requests_table(arrivals, launches, error=["queue full" if i % 10 == 0 else "" for i in range(200)])
    verdict = sustain(table, 20.0)
    assert abs(verdict.queue_growth) < 0.1 and verdict.served_share == pytest.approx(0.9)
    assert not verdict.sustained and verdict.reasons == ["served 90.0% < 99%"]


def test_requests_still_waiting_at_the_end_count_as_waiting():
    table = requests_table([1.0, 2.0], [math.nan, 2.5], error=[NO_TERMINAL, ""])
    assert waiting(table, np.array([0.5, 1.5, 2.2, 3.0])).tolist() == [0, 1, 2, 1]


def test_goodput_below_90_percent_is_not_sustained():
    arrivals = np.arange(0, 20, 0.5)
    table = requests_table(arrivals, arrivals + 0.1)
    assert sustain(table, 20.0, {"ttft": 0.5}).sustained
    verdict = sustain(table, 20.0, {"ttft": 0.15})  # TTFT 0.2 s everywhere
    assert not verdict.sustained and verdict.goodput == 0.0 and "goodput" in verdict.reasons[0]


def threshold_measure(capacity_req_s: float, seen: list[float]):
    def measure(rate: float) -> Probe:
        seen.append(rate)
        return Probe(rate, Verdict(rate <= capacity_req_s, [], 1.0, 0.0))

    return measure


@pytest.mark.parametrize("start", [0.2, 7.0, 300.0])
def test_the_search_brackets_a_known_threshold_to_the_asked_width(start):
    seen: list[float] = []
    cap = search("x", start, threshold_measure(7.3, seen), width=0.1, max_probes=30)
    assert cap.lo_req_s <= 7.3 < cap.hi_req_s and cap.hi_req_s / cap.lo_req_s <= 1.1
    assert cap.estimate_req_s == pytest.approx(math.sqrt(cap.lo_req_s * cap.hi_req_s))
    assert len(seen) == len(set(seen)) == len(cap.probes)


def test_a_search_out_of_probes_leaves_the_bracket_open():
    cap = search("x", 1.0, threshold_measure(1e9, []), max_probes=3)
    assert (cap.lo_req_s, cap.hi_req_s, cap.estimate_req_s) == (2.25, None, None)


def test_a_sustained_rate_above_a_failing_one_does_not_make_an_inverted_bracket():
    probes = [Probe(r, Verdict(ok, [], 1.0, 0.0)) for r, ok in ((4.0, True), (6.0, False), (8.0, True))]
    assert bracket(probes) == (4.0, 6.0) and next_rate(probes, 4.0, width=0.15) == pytest.approx(4.9)


@pytest.mark.slow
def test_the_search_in_the_simulator_finds_the_fixed_service_times_capacity(tmp_path):
    plan = load_plan(fixed_service_config(tmp_path, duration_s=120))
    settings = plan.auto
    runner = SimulatedSearch(plan, settings)
    far = search("naive", 2.0, runner.measure(plan.entries[0]), width=settings.width, max_probes=settings.max_probes)
    [from_burst] = search_all(plan, runner, settings).values()
    for cap in (far, from_burst):
        assert cap.estimate_req_s == pytest.approx(1 / SERVICE_S, rel=0.05)
        assert cap.as_dict()["estimate_tok_s"] == pytest.approx(OUT / SERVICE_S, rel=0.05)


class Notes:
    def __init__(self):
        self.lines = []

    def note(self, line):
        self.lines.append(line)


def test_a_saturated_run_too_short_to_bound_mu_runs_again_twice_as_long(tmp_path):
    """A worker slower than the run's length allows (one request a second): a 1.2 s run completes one request in
    its steady window [0.3, 1.2] s (no μ); 2.4 s, two in [0.6, 2.4] s (μ from one gap, interval unbounded); 4.8 s,
    three: μ exactly 1 req/s, its interval bounded. A run that stays too short after two extensions (0.2, 0.4,
    0.8 s: no completion) is refused with the longest tried; one whose last try still cannot bound μ keeps it."""
    from batchlab.lab.capacity_search import EXTENSIONS, durations, extended
    from batchlab.stats.saturation import SaturatedRun

    plan = load_plan(fixed_service_config(tmp_path, duration_s=10, prefill_s=1.0 - (OUT - 1) * DECODE_S))
    one = {"saturated_repeats": 1, "saturated_min_repeats": 1}  # one repeat: μ's interval must be the run's own
    entry, slow = plan.entries[0], plan.auto.model_copy(update={"saturated_duration_s": 1.2, **one})
    assert durations(slow) == [1.2, 2.4, 4.8] and EXTENSIONS == 2
    run = SimulatedSearch(plan, slow).saturated(entry, 0)
    assert run.req_s == pytest.approx(1.0) and math.isfinite(run.req_s_hi) and run.window_s[1] > 2.4
    short = plan.auto.model_copy(update={"saturated_duration_s": 0.2, **one})
    with pytest.raises(SweepError, match=r"too few requests in its steady window, even over 0.8 s"):
        SimulatedSearch(plan, short).saturated(entry, 0)
    unbounded = SaturatedRun(0, 3.0, 0.0, math.inf, 9.0, 0.0, math.inf, [1.0, 2.0], 3)
    bounded = SaturatedRun(0, 3.0, 2.0, 4.0, 9.0, 6.0, 12.0, [1.0, 4.0], 9)
    notes, tried = Notes(), []
    assert extended("x", [1.0, 2.0, 4.0], lambda d: tried.append(d) or {2.0: unbounded, 4.0: bounded}.get(d),
                    notes) is bounded
    assert tried == [1.0, 2.0, 4.0] and notes.lines == [
        "saturated x: fewer than 2 completion events in the steady window of 1 s; running it again for 2 s",
        "saturated x: too few completions for an interval of μ in the steady window of 2 s; running it again for 4 s"]
    assert extended("x", [1.0, 2.0], lambda d: unbounded) is unbounded  # the last try's μ, its interval says so
    tried.clear()  # with repeats, μ's interval is their spread: a run's own point estimate is enough
    assert extended("x", [1.0, 2.0], lambda d: tried.append(d) or unbounded, own_interval=False) is unbounded
    assert tried == [1.0]


def test_a_live_saturated_run_is_extended_into_its_folder_and_a_resume_starts_from_the_extension(tmp_path,
                                                                                                 monkeypatch):
    """The live search runs the point again with the longer traffic (the simulator's tables stand in for the
    runs); a resumed search whose folder holds the 4.8 s run reuses it without the shorter tries."""
    from batchlab.lab import capacity_search
    from batchlab.lab.capacity_search import LiveSearch

    plan = load_plan(fixed_service_config(tmp_path, duration_s=10, prefill_s=1.0 - (OUT - 1) * DECODE_S))
    one = {"saturated_repeats": 1, "saturated_min_repeats": 1}  # one repeat: μ's interval must be the run's own
    entry, slow = plan.entries[0], plan.auto.model_copy(update={"saturated_duration_s": 1.2, **one})
    virtual, ran, done = SimulatedSearch(plan, slow), [], set()
    monkeypatch.setattr(LiveSearch, "_run", lambda self, point, base, what, extension: ran.append(
        (point.folder, base["duration_s"], extension)) or {"status": "done"})
    monkeypatch.setattr("batchlab.collector.parts.load_table", lambda folder, name: virtual._requests(
        *capacity_search._saturated_point(plan, entry, tmp_path, 0, slow, ran[-1][1]))[0] if name == "requests"
        else pd.DataFrame())  # no batches or steps: μ's busy-time estimate reads none
    monkeypatch.setattr(capacity_search, "reused", lambda point, base, resume: base["duration_s"] in done or None)
    notes = Notes()
    run = LiveSearch(plan, tmp_path, slow, view=notes).saturated(entry, 0)
    folder = tmp_path / "_saturated" / "sweep_label=naive" / "sweep_rate=inf" / "sweep_repeat=0"
    # the longer runs are extensions: the stale shorter folder is not announced as "measured again" besides
    assert ran == [(folder, 1.2, False), (folder, 2.4, True), (folder, 4.8, True)] and run.req_s == pytest.approx(1.0)
    assert run.folder == "_saturated/sweep_label=naive/sweep_rate=inf/sweep_repeat=0"
    assert "running it again for 2.4 s" in notes.lines[0]
    ran.clear()
    done.add(4.8)
    assert LiveSearch(plan, tmp_path, slow).saturated(entry, 0).req_s == pytest.approx(1.0) and ran == [(folder, 4.8, True)]


def test_brackets_from_fixed_grid_rates_use_the_same_criterion_in_offered_rates():
    def run(rate: float, served_req_s: float) -> tuple[float, pd.DataFrame, float]:
        arrivals = np.arange(0, 20, 1 / (0.9 * rate))  # the schedule offered 90% of its nominal rate
        launches = np.maximum(arrivals, np.arange(len(arrivals)) / served_req_s)
        return rate, requests_table(arrivals, launches), 20.0

    cap = from_runs("x", [run(5.0, 50), run(10.0, 50), run(10.0, 5), run(20.0, 5)])
    assert cap.lo_req_s == pytest.approx(4.5) and cap.hi_req_s == pytest.approx(9.0)  # one repeat at 10 fell behind
    doc = cap.as_dict()  # the interval's low end: 4.5 less what the queue may have gained there (none: launched at once)
    assert doc["bracket_req_s"] == [cap.lo_req_s, cap.hi_req_s] and doc["lo_tok_s"] == pytest.approx(18.0)


def test_automatic_rates_span_every_capacity_log_spaced():
    rates = span_rates([2.0, 10.0], AutoRates(points=5, low=0.3, high=1.3))
    assert rates[0] == pytest.approx(0.6) and rates[-1] == pytest.approx(13.0) and len(rates) == 5
    ratios = np.diff(np.log(rates))
    assert np.allclose(ratios, ratios[0], rtol=0.02)


def test_automatic_rates_reject_an_empty_span(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("base: {backend: sim}\ngrid: {strategies: [naive], rates: {auto: {low: 2, high: 1}}}\n")
    with pytest.raises(SweepError, match="low < high"):
        load_plan(config)


def test_the_capacity_command_searches_in_virtual_time_and_names_bad_labels(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    config = fixed_service_config(tmp_path, duration_s=120)
    result = CliRunner().invoke(app, ["capacity", config, "--simulate"])
    assert result.exit_code == 0, result.output
    row = next(ln for ln in result.output.splitlines() if ln.startswith("naive"))
    assert float(row.split()[1]) == pytest.approx(1 / SERVICE_S, rel=0.05)
    bad = CliRunner().invoke(app, ["capacity", config, "--simulate", "--strategy", "nope"])
    assert bad.exit_code == 1 and "no grid entry labelled nope" in bad.output


def test_the_simulated_capacity_search_writes_capacity_json_into_out(tmp_path):
    """--out is not ignored in virtual time: capacity.json lands there as the live search writes it."""
    import json

    from typer.testing import CliRunner

    from batchlab.cli.main import app

    config = fixed_service_config(tmp_path, duration_s=120)
    result = CliRunner().invoke(app, ["capacity", config, "--simulate", "--out", str(tmp_path / "cap")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert doc["simulated"] is True and "plan_hash" not in doc
    assert doc["strategies"]["naive"]["estimate_req_s"] == pytest.approx(1 / SERVICE_S, rel=0.05)


def test_a_strategy_whose_saturated_run_failed_is_left_unmeasured_without_stopping_the_others():
    from types import SimpleNamespace

    from batchlab.lab.capacity_search import search_one
    from batchlab.lab.saturated_repeats import saturate_all
    from batchlab.lab.sweep_plan import Entry
    from batchlab.stats.saturation import SaturatedRun

    class Runner:
        def saturated(self, entry, repeat):
            if entry.label == "slow":
                raise SweepError("the saturated run of slow failed: no worker")
            return SaturatedRun(repeat, 7.5 + repeat, 7.4, 7.6 + repeat, 75.0, 74.0, 76.0, [1.0, 9.0], 60)

        def measure(self, entry, saturated=None):
            return threshold_measure(7.3, [])

    entries = [Entry(lb, {}) for lb in ("slow", "fine")]
    settings = AutoRates(width=0.05, max_probes=20, saturated_repeats=2)
    runs = saturate_all(SimpleNamespace(repeats=1), Runner(), entries, settings)  # saturated_repeats wins
    slow, fine = (search_one(e, Runner(), settings, runs[e.label]) for e in entries)
    assert (slow.lo_req_s, slow.hi_req_s, slow.probes) == (None, None, []) and "no worker" in slow.note
    assert slow.as_dict()["note"] == slow.note and fine.lo_req_s <= 7.3 < fine.hi_req_s
    assert [r["repeat"] for r in fine.saturated["runs"]] == [0, 1] and fine.saturated["req_s"] == pytest.approx(math.sqrt(7.5 * 8.5))


def test_the_search_never_places_capacity_above_the_saturated_rate():
    saturated = {"req_s": 5.0, "req_s_lo": 4.8, "req_s_hi": 5.2}
    seen: list[float] = []
    cap = search("x", 4.8, threshold_measure(100.0, seen), width=0.08, saturated=saturated)  # every rate "passes"
    assert cap.hi_req_s == 5.2 and cap.estimate_req_s <= 5.0 and max(seen) < 5.2 and len(seen) <= 2


def test_a_capacity_held_below_its_bracket_by_mu_keeps_its_estimate_inside_its_interval():
    from batchlab.stats.capacity import CapacityEstimate, Probe
    from batchlab.stats.verdict import Verdict

    sustained = Probe(3.56, Verdict(True, [], 1.0, 0.1, None, 3.08, -0.2, 0.3))
    cap = CapacityEstimate("naive", 3.08, 3.67, [sustained],
                           saturated={"req_s": 2.47, "req_s_lo": 1.27, "req_s_hi": 3.67})
    lo, hi = cap.interval_req_s
    assert cap.estimate_req_s == pytest.approx(2.47) and lo <= cap.estimate_req_s <= hi == 3.67
