"""repeats: auto on a simulated sweep: extra repeats only of the headline's comparisons, until their
intervals are narrow enough or the maximum count ran."""
import json

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.lab.simulate import simulate_run
from batchlab.lab.sweep_plan import SweepError, load_plan
from batchlab.lab.sweep import MIN_REPEATS, run_more_repeats
from batchlab.collector.layout import DONE_FILE, INDEX_FILE

BASE = "{backend: sim, preset: a100-llama2-7b, dataset: synthetic, duration_s: 10, max_new_tokens: 32, batch_size: 8}"


def simulated(tmp_path, width_pct: float, most: int = 3):
    config = tmp_path / "grid.yaml"
    config.write_text(f"base: {BASE}\ngrid: {{strategies: [naive, continuous], rates: [2, 4, 100], "
                      f"repeats: {{auto: {{start: 1, max: {most}, width_pct: {width_pct}}}}}}}\n")
    out = tmp_path / "out"
    assert CliRunner().invoke(app, ["simulate", str(config), "--out", str(out)]).exit_code == 0
    plan = load_plan(config)

    def run_point(point):
        simulate_run(point.config(plan.base))
        record = point.record("done")
        (point.folder / DONE_FILE).write_text(json.dumps(record))
        return record

    index = json.loads((out / INDEX_FILE).read_text())
    save = lambda doc: (out / INDEX_FILE).write_text(json.dumps(doc))  # noqa: E731
    return run_more_repeats(plan, out, index, run_point, save)


def test_wide_intervals_get_more_repeats_of_the_compared_points_only_up_to_the_maximum(tmp_path):
    index = simulated(tmp_path, width_pct=1e-6)
    extra = [(p["label"], p["rate"], p["repeat"]) for p in index["points"] if p["repeat"] > 0]
    assert sorted(extra) == [("continuous", 4.0, 1), ("continuous", 4.0, 2), ("naive", 4.0, 1), ("naive", 4.0, 2)]
    assert index["repeats"] == 3 and index["repeats_auto"]["ran"] == 3


def test_narrow_enough_intervals_stop_the_repeats_once_three_repeats_measured_the_spread(tmp_path):
    index = simulated(tmp_path, width_pct=1e6, most=5)  # any interval is narrow enough: only the count matters
    assert index["repeats_auto"]["ran"] == MIN_REPEATS == 3 and max(p["repeat"] for p in index["points"]) == 2
    assert index["repeats_auto"]["width_pct_now"]["continuous"] is not None


def test_one_repeat_measures_no_run_to_run_variation_so_it_is_never_narrow_enough(tmp_path):
    index = simulated(tmp_path, width_pct=1e6, most=2)
    assert index["repeats_auto"]["ran"] == 2  # at the cap, short of MIN_REPEATS
    assert index["repeats_auto"]["width_pct_now"] == {"continuous": None}


def test_repeats_auto_rejects_a_start_above_the_maximum(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("base: {backend: sim}\ngrid: {strategies: [naive], rates: [1], repeats: {auto: {start: 5, max: 2}}}\n")
    with pytest.raises(SweepError, match="start ≤ max"):
        load_plan(config)
