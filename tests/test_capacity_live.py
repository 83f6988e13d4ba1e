"""`batchlab capacity` live: real processes on the sim backend with a fixed per-request service time find
the capacity queueing theory predicts (one worker, one request at a time: 1 / service time)."""
import json

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from test_capacity import OUT, SERVICE_S, fixed_service_config

pytestmark = pytest.mark.slow


def test_the_live_search_finds_the_fixed_service_times_capacity(tmp_path):
    config = fixed_service_config(tmp_path, duration_s=15)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["capacity", config, "--out", str(out), "--width", "0.06", "--max-probes", "8"])
    assert result.exit_code == 0, result.output
    [cap] = json.loads((out / "capacity.json").read_text())["strategies"].values()
    assert cap["estimate_req_s"] == pytest.approx(1 / SERVICE_S, rel=0.05), cap["probes"]
    assert cap["estimate_tok_s"] == pytest.approx(OUT / SERVICE_S, rel=0.05)
    for probe in cap["probes"]:  # each probe an ordinary point folder with its tables
        assert (out / probe["folder"] / "requests.parquet").exists() and (out / probe["folder"] / "point.json").exists()
