"""The headline's fixed rule on simulated sweeps: twin strategies read as no significant difference, continuous
batching beats naive where queueing theory says it must, dynamic batching serves what naive serves at
saturation, one repeat claims no significance, and every number carries an interval or the words."""
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.report.build import run_report
from batchlab.report.capacities import FROM_GRID, SEARCHED, load_capacities
from batchlab.report.headline import capacity_ratio, common_rate, headlines, throughput_ratio
from batchlab.report.points import load_collection
from batchlab.report.setup import hardware
from batchlab.stats.intervals import between_repeats

runner = CliRunner()
# naive launches exactly 8: at 4 req/s a request waits for up to 7 more arrivals (about 0.9 s on average
# before service), while continuous batching admits it at the next step (tens of ms on this step model)
BASE = "{backend: sim, preset: a100-llama2-7b, dataset: synthetic, duration_s: 20, max_new_tokens: 32, batch_size: 8}"


_simulated: dict[tuple, Path] = {}  # a grid simulated once for the module: later tests copy its untouched folder


def simulated_sweep(tmp_path, strategies: str, rates: str = "[2, 4, 100]", repeats: int = 3):
    out = tmp_path / "out"
    if (key := (strategies, rates, repeats)) not in _simulated:
        config = tmp_path / "grid.yaml"
        config.write_text(f"base: {BASE}\ngrid: {{strategies: {strategies}, rates: {rates}, repeats: {repeats}}}\n")
        result = runner.invoke(app, ["simulate", str(config), "--out", str(tmp_path / "simulated")])
        assert result.exit_code == 0, result.output
        _simulated[key] = tmp_path / "simulated"
    shutil.copytree(_simulated[key], out)  # the test's own copy: it may write into it
    collection = load_collection(out)
    capacities, source = load_capacities(collection)
    hardware_of = {r.label: hardware(r.settings) for r in collection.runs}
    return collection, capacities, source, headlines(collection, capacities, hardware_of), hardware_of


def bare_numbers(text: str, hardware_texts) -> list[str]:
    """Numbers in a headline that carry neither an interval/bracket nor a bound sign: settings (the common
    load, the 0.8 share, pair and repeat counts) and the machine's name are not measurements."""
    for hw in hardware_texts:
        text = text.replace(hw, "")
    text = re.sub(r"λ = [\d.]+ req/s|≤ 0\.8 ×|\d+ requests in \d+ repeat\(s\)|\d+ paired repeat\(s\)"
                  r"|\([^()]*\[[^\]]*\][^()]*\)|[+−-][\d.]+% \(one repeat: run-to-run variation not measured\)",
                  "", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # interval contents
    numbers = re.finditer(r"(?<![\w.])([+−-]?\d+(?:\.\d+)?)(%?)", text)
    return [m.group(0) for m in numbers if not text[m.end():].lstrip().startswith("[")
            and not text[:m.start()].rstrip().endswith(("≥", "<"))]


@pytest.mark.slow
def test_two_identical_strategies_read_as_no_significant_difference(tmp_path):
    _, capacities, source, [line], hw = simulated_sweep(tmp_path, "[naive, {strategy: naive, label: naive-twin}]")
    assert source == FROM_GRID and capacities["naive"]["lo_req_s"] == capacities["naive-twin"]["lo_req_s"]
    assert line.label == "naive-twin" and line.rate == 4.0 and line.ttft.clusters == 3
    assert not line.capacity.significant and not line.ttft.significant and not line.e2e.significant
    assert line.throughput is None and "no saturated throughput measured" in line.text  # a fixed-rate sweep
    assert "no significant difference in capacity" in line.text
    assert "no significant difference in TTFT p50" in line.text and "no significant difference in E2E p50" in line.text
    assert bare_numbers(line.text, hw.values()) == []


def test_one_repeat_states_the_estimate_and_that_run_to_run_variation_was_not_measured(tmp_path):
    _, _, _, [line], hw = simulated_sweep(tmp_path, "[naive, continuous]", repeats=1)
    assert not line.ttft.measured and not line.ttft.significant and line.ttft.estimate < 0
    latency = line.text.split("At λ")[1]
    assert "TTFT p50 −" in latency and "run-to-run variation not measured" in latency
    assert "significant" not in latency
    assert bare_numbers(line.text, hw.values()) == []
    (tmp_path / "saturated").mkdir()
    collection, capacities, *_ = simulated_sweep(tmp_path / "saturated", "[naive, continuous]", repeats=1)
    for label in capacities:
        capacities[label]["saturated"] = saturated(collection.group(label, 100.0), 20.0)
    [line] = headlines(collection, capacities, hw)
    assert not line.throughput.measured and "changed throughput by " in line.text
    assert line.text.count("run-to-run variation not measured") == 1  # said once, for all three figures
    assert "Throughput, TTFT p50, E2E p50 from one repeat" in line.text and "is called significant" in line.text


@pytest.mark.slow
def test_continuous_beats_naive_at_a_load_both_sustain_significantly_and_in_the_right_direction(tmp_path):
    _, _, _, [line], hw = simulated_sweep(tmp_path, "[naive, continuous]")
    assert line.label == "continuous" and line.rate == 4.0 and line.ttft.clusters == 3
    assert line.ttft.significant and line.ttft.hi < 0  # lower TTFT, the whole interval below zero
    assert line.e2e.significant and line.e2e.hi < 0
    assert re.search(r"TTFT p50 −\d+(\.\d+)?% \[−", line.text)
    assert bare_numbers(line.text, hw.values()) == []


def test_the_number_checker_catches_a_bare_number():
    assert bare_numbers("capacity +12% [+3%, +20%] and throughput +4.0%", []) == ["+4.0%"]
    assert bare_numbers("naive ≥ 4.6 (no failing rate measured)", []) == []


def test_capacity_ratio_interval_comes_from_both_brackets_and_open_brackets_give_none():
    old = {"lo_req_s": 2.0, "hi_req_s": 2.5, "estimate_req_s": 2.236}
    new = {"lo_req_s": 4.0, "hi_req_s": 5.0, "estimate_req_s": 4.472}
    r = capacity_ratio(new, old)
    assert (r.lo, r.hi) == pytest.approx((60.0, 150.0)) and r.estimate == pytest.approx(100.0) and r.significant
    assert not capacity_ratio({"lo_req_s": 2.2, "hi_req_s": 2.6, "estimate_req_s": 2.39}, old).significant
    assert capacity_ratio({"lo_req_s": 4.0, "hi_req_s": None}, old) is None


def test_the_common_load_is_the_highest_grid_rate_within_80_percent_of_the_lower_capacity():
    a, b = {"estimate_req_s": 10.0}, {"estimate_req_s": 5.0}
    assert common_rate([1.0, 3.0, 4.0, 4.5, 8.0], a, b) == (4.0, "")
    assert common_rate([5.0, 8.0], a, b) == (None, "")
    assert common_rate([1.0], {"lo_req_s": 2.0}, b) == (1.0, "")  # an open bracket's floor vouches for its load


def test_a_missing_or_contradicted_capacity_falls_back_to_the_lowest_rate_both_served_and_says_so():
    # make run beside other work: naive "< 1.98 (no rate sustained)" though its grid point at 3.69 finished 39
    # of 39; the 21× TTFT gap at 0.594 req/s was in the table and not in the answer
    def held(*rates: float) -> list[dict]:
        return [{"rate": r, "offered_req_s": 0.98 * r} for r in rates]

    naive = {"label": "naive", "hi_req_s": 1.98, "grid_sustained": held(0.594, 1.14, 3.69)}
    dynamic = {"label": "dynamic", "estimate_req_s": 6.0, "grid_sustained": held(0.594, 1.14, 3.69, 5.0)}
    rate, basis = common_rate([0.594, 1.14, 3.69, 7.0], dynamic, naive)
    assert rate == 0.594 and "lowest grid rate both served fully" in basis and "naive's capacity was not measured" in basis
    capped = {"label": "naive", "estimate_req_s": 1.2, "grid_sustained": held(0.594, 1.14, 3.69)}  # below its 3.69
    rate, basis = common_rate([0.594, 1.14, 3.69], dynamic, capped)
    assert rate == 0.594 and "is below λ = 3.69, which its grid sustained" in basis
    near = {"label": "naive", "estimate_req_s": 3.5, "grid_sustained": held(0.594, 3.69)}  # 3.62 offered: within 5%
    assert common_rate([0.594, 1.14, 3.69], dynamic, near) == (1.14, "")
    assert common_rate([0.594, 1.14], dynamic, {"label": "naive", "estimate_req_s": 0.7,
                                                 "grid_sustained": held(0.594)}) == (
        0.594, "the lowest grid rate both served fully with a flat queue: no grid rate was at or below 0.8 × the "
        "lower capacity")
    assert common_rate([0.594], dynamic, {"label": "naive"}) == (None, "")  # nothing sustained by both


@pytest.mark.slow
def test_the_report_leads_with_the_capacity_table_then_the_headline(tmp_path):
    collection, *_ = simulated_sweep(tmp_path, "[naive, continuous]")
    result = run_report(str(collection.root))
    text = result.path.read_text()
    assert text.index("## Capacity") < text.index("## Result") < text.index("## Plots")
    assert "| naive |" in text.split("## Result")[0] and result.capacity_lines[0].startswith("strategy")


def test_a_searched_capacity_in_capacity_json_is_preferred_to_the_grid(tmp_path):
    import json

    collection, *_ = simulated_sweep(tmp_path, "[naive, continuous]")
    doc = {"search": {}, "strategies": {lb: {"label": lb, "lo_req_s": 1.0, "hi_req_s": 1.1, "estimate_req_s": 1.05,
                                             "probes": []} for lb in ("naive", "continuous")}}
    (collection.root / "capacity.json").write_text(json.dumps(doc))
    index = json.loads((collection.root / "sweep.json").read_text())
    collection.index.pop("capacity", None)
    capacities, source = load_capacities(load_collection(collection.root))
    assert source == SEARCHED and capacities["naive"]["hi_req_s"] == 1.1 and "points" in index


def saturated(runs, duration_s: float) -> dict:
    """capacity.json's `saturated` entry (the capacity search's interface) from a sweep's saturated points:
    each repeat's completions per second over the traffic's last three quarters (warm-up left out)."""
    rows = []
    for r in runs:
        done = r.requests["completion_time"].dropna()
        rows.append({"repeat": r.repeat, "req_s": float(done.between(duration_s / 4, duration_s).sum())
                     / (0.75 * duration_s)})
    mean = sum(row["req_s"] for row in rows) / len(rows)
    return {"runs": rows, "req_s": mean, "req_s_lo": min(row["req_s"] for row in rows),
            "req_s_hi": max(row["req_s"] for row in rows), "method": "test: completions / window"}


@pytest.mark.slow
def test_dynamic_serves_what_naive_serves_at_saturation_and_is_far_faster_at_low_load(tmp_path):
    # both launch full batches of 8 when requests pile up, so their saturated μ agree (queueing theory: the same
    # service process); at 2 req/s naive waits for 7 more arrivals (about 1.75 s on average), dynamic 50 ms
    collection, capacities, _, _, hw = simulated_sweep(tmp_path, "[naive, {strategy: dynamic, max_batch_size: 8}]")
    for label in capacities:
        capacities[label]["saturated"] = saturated(collection.group(label, 100.0), 20.0)
    [line] = headlines(collection, capacities, hw)
    assert line.throughput.clusters == 3 and abs(line.throughput.estimate) < 5
    assert not line.throughput.significant or max(abs(line.throughput.lo), abs(line.throughput.hi)) < 5
    assert line.ttft.significant and line.ttft.hi < -50  # far lower TTFT, the whole interval
    assert line.text.startswith("Dynamic batching ") and " throughput " in line.text and "TTFT p50" in line.text
    assert "naive batching at λ = " in line.text and bare_numbers(line.text, hw.values()) == []


def test_the_throughput_claim_pairs_saturated_runs_by_repeat():
    def entry(rates):
        return {"saturated": {"runs": [{"repeat": k, "req_s": v} for k, v in enumerate(rates)]}}

    r = throughput_ratio(entry([6.0, 6.6, 5.4, 9.0]), entry([5.0, 6.0, 4.5]))  # repeat 3 has no partner
    assert r == between_repeats([6.0 / 5.0, 6.6 / 6.0, 5.4 / 4.5]) and r.clusters == 3 and r.significant
    assert throughput_ratio({"estimate_req_s": 5.0}, entry([5.0])) is None  # an older capacity.json: no runs
    assert not throughput_ratio(entry([6.0]), entry([5.0])).measured  # one repeat: the estimate alone
