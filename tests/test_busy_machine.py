"""The answer under the noise a busy machine makes: the sim backend's speed moving within a run and a neighbour
that takes a share of the worker's time in bursts (worker/machine_noise.py), and the headline holding under
them: the right direction, significant where the difference is large, a latency comparison made, no μ
interval below zero, no capacity below a rate its own sweep sustained."""
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from batchlab.worker.machine_noise import MachineNoise
from batchlab.worker.sim import step_ends


def test_a_neighbour_takes_its_share_in_bursts_of_the_mean_lengths_asked():
    noise = MachineNoise(neighbour_share=0.4, neighbour_on_s=2.0, neighbour_off_s=6.0, keys=(1,))
    t = np.arange(0, 4000, 0.05)
    factors = np.array([noise.factor(x) for x in t])
    on = factors > 1.0
    assert set(np.round(factors, 9)) == {1.0, round(1 / 0.6, 9)}  # a step takes 1 / (1 - share) as long
    assert on.mean() == pytest.approx(2.0 / 8.0, abs=0.03)  # on a quarter of the time
    starts = np.flatnonzero(np.diff(on.astype(int)) == 1)
    assert len(starts) == pytest.approx(4000 / 8.0, rel=0.15)  # a burst every 8 s on average
    assert noise.factor(123.4) == MachineNoise(neighbour_share=0.4, neighbour_on_s=2.0, neighbour_off_s=6.0,
                                               keys=(1,)).factor(123.4)  # seeded: the same run, the same machine


def test_the_drift_within_a_run_has_the_stationary_spread_and_memory_asked():
    noise = MachineNoise(speed_drift=0.2, speed_drift_s=3.0, keys=(7,))
    logs = np.log([noise.factor(x) for x in np.arange(0, 6000, 0.3)])
    assert logs.std() == pytest.approx(0.2, rel=0.15) and abs(logs.mean()) < 0.05
    lag = 10  # 3 s apart: one correlation time
    assert np.corrcoef(logs[:-lag], logs[lag:])[0, 1] == pytest.approx(math.exp(-1), abs=0.1)
    assert MachineNoise(keys=(7,)).factor(5.0) == 1.0 and not MachineNoise().active


def test_each_step_takes_the_slowdown_at_its_start():
    noise = MachineNoise(neighbour_share=0.5, neighbour_on_s=1e9, neighbour_off_s=1e-9, keys=(0,))  # always on
    assert step_ends(10.0, [1.0, 1.0], noise, origin_s=10.0) == pytest.approx([12.0, 14.0])
    assert step_ends(10.0, [1.0, 1.0]) == [11.0, 12.0]


BUSY = {"speed_noise": 0.1, "speed_drift": 0.15, "speed_drift_s": 2.0, "neighbour_share": 0.3,
        "neighbour_on_s": 3.0, "neighbour_off_s": 6.0}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_the_headline_holds_on_a_busy_simulated_machine(tmp_path, seed):
    from typer.testing import CliRunner

    from batchlab.cli.main import app
    from batchlab.report.capacities import load_capacities
    from batchlab.report.headline import headlines
    from batchlab.report.points import load_collection
    from batchlab.report.setup import hardware

    plan = yaml.safe_load((Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml").read_text())
    plan["base"].update(BUSY, duration_s=6)  # points of 6 s, whatever the smoke's own budget sets
    plan["grid"].update(seed=seed, repeats=3)
    plan["grid"]["rates"]["auto"].update(points=3)
    config = tmp_path / "busy.yaml"
    config.write_text(yaml.safe_dump(plan))
    result = CliRunner().invoke(app, ["simulate", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    collection = load_collection(tmp_path / "out")
    capacities, _ = load_capacities(collection)
    found = {h.label: h for h in headlines(collection, capacities, {r.label: hardware(r.settings)
                                                                     for r in collection.runs})}
    for c in capacities.values():
        sat = c["saturated"]
        assert 0 < sat["req_s_lo"] <= sat["req_s"] <= sat["req_s_hi"]  # never below zero
        assert not any("which the same sweep sustained" in note for note in c["checks"]), c["checks"]
    cont, dyn = found["continuous"], found["dynamic"]
    assert cont.throughput.significant and cont.throughput.estimate > 30, cont.text  # ≈ +84% noise-free
    assert dyn.rate is not None and cont.rate is not None  # a latency comparison is made for each
    assert dyn.ttft.significant and dyn.ttft.estimate < -30, dyn.text  # dynamic's TTFT cut, ≈ −80% noise-free
