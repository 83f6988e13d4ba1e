"""benchmarks/harness.py: a modest rate through all four processes, and the table it writes."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import harness  # noqa: E402

pytestmark = pytest.mark.slow  # all four processes


def test_a_modest_rate_finishes_without_loss_and_writes_its_table(tmp_path, capsys):
    rows = harness.main(["--rates", "200", "--duration", "1", "--out", str(tmp_path)])
    assert len(rows) == 1 and rows[0]["lost"] == 0 and rows[0]["finished"] == rows[0]["scheduled"] > 100
    table = pd.read_parquet(tmp_path / "harness.parquet")
    assert list(table.columns) == harness.COLUMNS
    saved = json.loads((tmp_path / "harness.json").read_text())
    assert set(harness.COLUMNS) <= set(saved[0])
    assert saved[0]["timing_fidelity"]["backend"] == "echo"
    assert "highest sustained rate" in capsys.readouterr().out
