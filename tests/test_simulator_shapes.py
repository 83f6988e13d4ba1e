"""configs/sim-shapes.yaml reproduces the predicted shapes (3 strategies × 10 rates × 60 s, simulated):
naive's long TTFT at low load, naive and dynamic at one throughput at high load, continuous' knee furthest right.

Knee: the highest offered rate a strategy sustains, i.e. finishes ≥ 90 % of the offered requests/s
(requests finished per second of the run's window vs. requests submitted per second of traffic).
"""
from pathlib import Path

import pytest

from batchlab.lab.simulate import plan_simulation, run_simulation

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sim-shapes.yaml"
SUSTAINED_FRACTION = 0.9


@pytest.fixture(scope="module")
def curves(tmp_path_factory) -> dict[str, dict[float, dict]]:
    """strategy -> rate -> Summary."""
    out = tmp_path_factory.mktemp("sim-shapes")
    results = run_simulation(plan_simulation(str(CONFIG), {"out": str(out)}))
    by: dict[str, dict[float, dict]] = {}
    for point, summary in results:
        by.setdefault(point.entry.label, {})[point.rate] = summary
    return by


def knee(curve: dict[float, dict]) -> float:
    sustained = [rate for rate, s in curve.items()
                 if s.requests_per_s >= SUSTAINED_FRACTION * s.submitted / s.settings["duration_s"]]
    return max(sustained)


def test_the_config_is_three_strategies_by_ten_rates_of_sixty_seconds_up_to_fifty(curves):
    assert sorted(curves) == ["continuous", "dynamic", "naive"]
    assert all(len(c) == 10 and max(c) == 50 for c in curves.values())
    assert curves["naive"][50].settings["duration_s"] == 60


def test_naive_has_a_long_ttft_at_low_load(curves):
    low = min(curves["naive"])
    naive, dynamic = curves["naive"][low].ttft.p50, curves["dynamic"][low].ttft.p50
    assert naive > 5.0  # seconds: it waits for 32 arrivals at 1 req/s
    assert naive > 10 * dynamic and naive > 10 * curves["continuous"][low].ttft.p50


def test_naive_and_dynamic_reach_the_same_throughput_at_high_load(curves):
    high = max(curves["naive"])
    naive, dynamic = curves["naive"][high].throughput_tok_s, curves["dynamic"][high].throughput_tok_s
    assert naive == pytest.approx(dynamic, rel=0.05)
    assert curves["naive"][high].ttft.p50 > 10  # both are far past their knee there


def test_continuous_has_the_knee_furthest_right(curves):
    knees = {name: knee(c) for name, c in curves.items()}
    assert knees["continuous"] > knees["dynamic"] and knees["continuous"] > knees["naive"]
    best = {name: max(s.throughput_tok_s for s in c.values()) for name, c in curves.items()}
    assert best["continuous"] > 1.2 * best["dynamic"]
