"""`batchlab sweep` shows each point's figures as it finishes and ends with the report's capacity and headline."""
import json
import re

import pytest

from tests.conftest import run_cli

CONFIG = """base: {backend: sim, preset: cpu-tiny-mistral, dataset: synthetic, duration_s: 2, max_new_tokens: 16,
       max_batch_size: 8, warmup_requests: 0}
grid: {strategies: [naive, dynamic], rates: [4], repeats: 1}
"""


@pytest.mark.slow  # a real sweep: processes per point
def test_a_sweep_prints_each_points_figures_then_the_capacity_table_and_headline(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    proc = run_cli("sweep", str(config), "--out", str(out), timeout_s=600)
    text = proc.stdout + proc.stderr
    for label in ("naive", "dynamic"):
        summary = json.loads((out / f"strategy={label}" / "rate=4" / "repeat=0" / "summary.json").read_text())
        line = re.search(rf"{label} λ=4 rep 0: done.*\n\s+(served .*)", text)
        assert line, text
        assert (f"served {summary['requests_per_s']:.2f} req/s, {summary['throughput_tok_s']:,.1f} tok/s, "
                f"TTFT p50 {summary['ttft']['p50'] * 1e3:,.1f} ms, E2E p50 {summary['e2e']['p50'] * 1e3:,.1f} ms"
                in line.group(1))
    assert "capacity (estimate [highest sustained, lowest not sustained]):" in proc.stdout
    assert f"report: {out / 'REPORT.md'}" in proc.stdout and (out / "REPORT.md").exists()
