"""`batchlab capacity` live: real processes on the sim backend with a fixed per-request service time (one
worker, one request at a time: at most 1 / service time, less the live scheduling overhead) measure μ
saturated and place the capacity just under it, never above."""
import json

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from test_capacity import OUT, SERVICE_S, fixed_service_config

pytestmark = pytest.mark.slow


def test_the_live_search_places_capacity_just_under_the_measured_saturated_rate(tmp_path):
    config = fixed_service_config(tmp_path, duration_s=15)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["capacity", config, "--out", str(out), "--width", "0.06", "--max-probes", "8"])
    assert result.exit_code == 0, result.output
    [cap] = json.loads((out / "capacity.json").read_text())["strategies"].values()
    mu = cap["saturated"]
    assert 0.7 / SERVICE_S <= mu["req_s"] <= 1.02 / SERVICE_S, mu  # no faster than its step time
    assert mu["tok_s"] == pytest.approx(OUT * mu["req_s"], rel=0.01)
    assert 0.9 * mu["req_s_lo"] <= cap["estimate_req_s"] <= mu["req_s"], cap["probes"]
    assert cap["hi_req_s"] <= mu["req_s_hi"] and cap["estimate_tok_s"] == pytest.approx(OUT * cap["estimate_req_s"])
    for run in mu["runs"]:  # each saturated run an ordinary point folder with its tables
        assert (out / run["folder"] / "requests.parquet").exists()
    for probe in cap["probes"]:  # each probe an ordinary point folder with its tables
        assert (out / probe["folder"] / "requests.parquet").exists() and (out / probe["folder"] / "point.json").exists()
