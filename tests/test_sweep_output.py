"""`batchlab sweep` shows each point's figures as it finishes and ends with the report's capacity and headline."""
import json
import re

import pytest


@pytest.mark.slow  # a real sweep: processes per point
def test_a_sweep_prints_each_points_figures_then_the_capacity_table_and_headline(smoke_sweep):
    out, _, stdout, stderr = smoke_sweep  # tests/data/fixed-rates.yaml through `batchlab sweep`: the shared sweep
    text = stdout + stderr
    for label in ("naive", "dynamic"):
        folder = out / f"sweep_label={label}" / "sweep_rate=4" / "sweep_repeat=0"
        summary = json.loads((folder / "summary.json").read_text())
        line = re.search(rf"{label} λ=4 rep 0: done.*\n\s+(served .*)", text)
        assert line, text
        assert (f"served {summary['requests_per_s']:.2f} req/s, {summary['throughput_tok_s']:,.1f} tok/s, "
                f"TTFT p50 {summary['ttft']['p50'] * 1e3:,.1f} ms, E2E p50 {summary['e2e']['p50'] * 1e3:,.1f} ms"
                in line.group(1))
    assert "capacity (estimate [highest sustained, lowest not sustained]):" in stdout
    assert f"report: {out / 'REPORT.md'}" in stdout and (out / "REPORT.md").exists()
