"""A live run on the `sim` backend and the simulator on the same schedule agree.

Dynamic batching, 20 req/s for 4 s on the a100 preset: TTFT and E2E p50 within 5 %, and the batches'
exact request sets match where timing allows (the live scheduler sees real clocks and message delays,
so a request arriving within a few ms of a launch may fall on either side of it).
"""
import json

import pandas as pd
import pytest

from tests.conftest import run_cli

SETTINGS = ["--strategy", "dynamic", "--rate", "20", "--duration", "4", "--preset", "a100-llama2-7b",
            "--dataset", "synthetic"]
P50_REL_TOL = 0.05
MIN_SAME_BATCHES = 0.5


def batch_sets(folder) -> list[frozenset[int]]:
    r = pd.read_parquet(folder / "requests.parquet")
    return [frozenset(g) for _, g in r.groupby("batch_id")["request_id"]]


@pytest.mark.slow
def test_simulated_run_matches_the_live_sim_backend(tmp_path):
    live, sim = tmp_path / "live", tmp_path / "sim"
    run_cli("run", "--backend", "sim", *SETTINGS, "--out", str(live))
    run_cli("simulate", *SETTINGS, "--schedule", str(live / "schedule.parquet"), "--out", str(sim))
    a, b = (json.loads((d / "summary.json").read_text()) for d in (live, sim))
    assert b["submitted"] == a["submitted"] == a["finished"] == b["finished"]
    for metric in ("ttft", "e2e"):
        assert b[metric]["p50"] == pytest.approx(a[metric]["p50"], rel=P50_REL_TOL), metric
    live_sets, sim_sets = batch_sets(live), set(batch_sets(sim))
    same = sum(s in sim_sets for s in live_sets) / len(live_sets)
    print(f"identical batches: {same:.0%} of {len(live_sets)}; TTFT p50 live {a['ttft']['p50']:.3f} s, "
          f"sim {b['ttft']['p50']:.3f} s; E2E p50 live {a['e2e']['p50']:.3f} s, sim {b['e2e']['p50']:.3f} s")
    assert same >= MIN_SAME_BATCHES
