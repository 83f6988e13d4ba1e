"""Real result files of GuideLLM and AIPerf (tests/data/real/, made by the tools against a vLLM-CPU server: its
README says how): every figure the tool printed on its console is in the report's section, nothing dropped."""
import json
import re
from pathlib import Path

import pytest

from batchlab.report.external import points_of, section

REAL = Path(__file__).parent / "data" / "real"
AIPERF = REAL / "aiperf-0.13.0_profile_export_aiperf.json"
# AIPerf's console rows → the point's figure (ms for latencies); its ITL is batchlab's TPOT
AIPERF_ROWS = {"Time to First Token (ms)": "ttft", "Inter Token Latency (ms)": "tpot", "Request Latency (ms)": "e2e"}
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def _console_row(console: str, name: str) -> list[float]:
    """The figures of one row of a console table (its first line), in the table's column order."""
    line = next(ln for ln in console.splitlines() if name in ln)
    return _numbers(line.split(name, 1)[1])


def _shown(text: str, value: float, printed_decimals: int) -> bool:
    """`value` (as the tool printed it, rounded) is among the section's numbers, to that rounding."""
    return any(abs(n - value) <= 0.6 * 10 ** -min(printed_decimals, 1) + 1e-9 for n in _numbers(text))


def test_aiperf_0_13_reads_its_rate_from_the_profiling_phase():
    point, = points_of(AIPERF, json.loads(AIPERF.read_text()))
    assert point.rate == 2.0 and point.label.startswith("aiperf: poisson @ 2 req/s")


def test_aiperf_0_13_every_printed_figure_is_in_the_report():
    console = (REAL / "aiperf-0.13.0_console.txt").read_text()
    points = points_of(AIPERF, json.loads(AIPERF.read_text()))
    text = "\n".join(section(points))
    row = next(ln for ln in text.splitlines() if ln.startswith("| aiperf: poisson @ 2 req/s"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "2"  # the rate asked for
    assert float(cells[3]) == _console_row(console, "Request Count (requests)")[0]
    assert float(cells[6]) == pytest.approx(_console_row(console, "Request Throughput (requests/sec)")[0], abs=0.006)
    assert float(cells[7]) == pytest.approx(_console_row(console, "Output Token Throughput (tokens/sec)")[0], abs=0.006)
    for name in AIPERF_ROWS:  # avg, min, max, p99, p90, p50, std: the report holds avg and the percentiles
        avg, _, _, p99, p90, p50, _ = _console_row(console, name)
        for value in (avg, p99, p90, p50):
            assert _shown(text, value, 2), (name, value)


def test_aiperf_metrics_the_report_does_not_show_are_named():
    data = json.loads(AIPERF.read_text())
    point, = points_of(AIPERF, data)
    text = "\n".join(section([point]))
    assert "time_to_second_token" in point.unplaced and "effective_concurrency" in point.unplaced
    assert "time_to_first_token" not in point.unplaced and "request_throughput" not in point.unplaced
    assert f"- {point.label}: " in text and "time_to_second_token" in text


GUIDELLM_2RPS = REAL / "guidellm-0.8.1_2rps_benchmarks.json"


def _guidellm_row(console: str, table: str) -> list[float]:
    """The figures of the benchmark's row in one of GuideLLM's console tables (its last print of it)."""
    block = console.rsplit(table, 1)[1]
    line = next(ln for ln in block.splitlines() if ln.startswith("| constant@"))
    return _numbers(line.split("|", 2)[2])


def test_guidellm_incomplete_requests_are_shown_not_dropped():
    """A run cut off with every request still in flight: 0 completed, 30 incomplete, as its console says."""
    console = (REAL / "guidellm-0.8.1_2rps_console.txt").read_text()
    point, = points_of(GUIDELLM_2RPS, json.loads(GUIDELLM_2RPS.read_text()))
    summary = _guidellm_row(console, "Run Summary Info")  # timings, then Comp / Inc / Err requests
    assert (point.completed, point.incomplete, point.failed) == tuple(int(v) for v in summary[-9:-6])
    text = "\n".join(section([point]))
    row = next(ln for ln in text.splitlines() if ln.startswith("| guidellm: constant @ 2 req/s"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:6] == ["2", "0", "0", "30"]
    _, _, per_s, _, out_tok_s, _ = _guidellm_row(console, "Server Throughput Statistics (All Requests)")
    assert float(cells[6]) == pytest.approx(per_s, abs=0.05) and float(cells[7]) == pytest.approx(out_tok_s, abs=0.05)
    assert all(v is None for m in point.latency.values() for v in m.values())  # none finished: no latency, not 0


GUIDELLM_SYNC = REAL / "guidellm-0.8.1_synchronous_benchmarks.json"
# GuideLLM's latency table groups (in its column order) → the point's metric and the group's unit in ms;
# its ITL is batchlab's TPOT, its TTFOT and TPOT have no place (TTFOT equals TTFT for text)
GUIDELLM_GROUPS = (("e2e", 1e3), ("ttft", 1.0), (None, 1.0), ("tpot", 1.0), (None, 1.0))


def test_guidellm_every_printed_latency_and_throughput_is_in_the_report():
    console = (REAL / "guidellm-0.8.1_synchronous_console.txt").read_text()
    point, = points_of(GUIDELLM_SYNC, json.loads(GUIDELLM_SYNC.read_text()))
    text = "\n".join(section([point]))
    block = console.rsplit("Request Latency Statistics (Completed Requests)", 1)[1]
    line = next(ln for ln in block.splitlines() if ln.startswith("| synchronous"))
    cells = [_numbers(c)[0] for c in line.strip().strip("|").split("|")[1:]]  # mean (± its margin), median, p95
    assert len(cells) == 3 * len(GUIDELLM_GROUPS)
    for i, (metric, unit_ms) in enumerate(GUIDELLM_GROUPS):
        if metric is None:
            continue
        mean, median, p95 = (v * unit_ms for v in cells[3 * i:3 * i + 3])
        half_unit = 0.05 * unit_ms + 1e-9  # the console's one decimal, in ms
        assert point.latency[metric]["mean"] * 1e3 == pytest.approx(mean, abs=half_unit), metric
        assert point.latency[metric]["p50"] * 1e3 == pytest.approx(median, abs=half_unit), metric
        assert point.latency[metric]["p95"] * 1e3 == pytest.approx(p95, abs=half_unit), metric
        for value in (mean, median, p95):
            assert any(abs(n - value) <= half_unit + 0.05 for n in _numbers(text)), (metric, value)
    summary = _guidellm_row(console.replace("| synchronous", "| constant@"), "Run Summary Info")
    assert (point.completed, point.incomplete, point.failed) == tuple(int(v) for v in summary[-9:-6]) == (4, 0, 0)
    _, _, per_s, _, out_tok_s, _ = _guidellm_row(console.replace("| synchronous", "| constant@"),
                                                 "Server Throughput Statistics (All Requests)")
    row = next(ln for ln in text.splitlines() if ln.startswith("| guidellm: synchronous"))
    row_cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(row_cells[6]) == pytest.approx(per_s, abs=0.05)
    assert float(row_cells[7]) == pytest.approx(out_tok_s, abs=0.05)


@pytest.mark.slow
def test_the_real_files_render_in_report_md_beside_a_run(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    runner = CliRunner()
    run = tmp_path / "run"
    done = runner.invoke(app, ["simulate", "--duration", "2", "--dataset", "synthetic", "--rate", "4",
                              "--out", str(run)])
    assert done.exit_code == 0, done.output
    files = [AIPERF, GUIDELLM_2RPS, GUIDELLM_SYNC]
    result = runner.invoke(app, ["report", str(run), *(a for f in files for a in ("--extra", str(f)))])
    assert result.exit_code == 0, result.output
    text = (run / "REPORT.md").read_text().split("## Other tools' runs")[1]
    assert "| aiperf: poisson @ 2 req/s [aiperf-0.13.0_profile_export_aiperf] | aiperf | 2 | 5 | 0 | - |" in text
    assert "| guidellm: constant @ 2 req/s [guidellm-0.8.1_2rps_benchmarks] | guidellm | 2 | 0 | 0 | 30 |" in text
    assert "| guidellm: synchronous [guidellm-0.8.1_synchronous_benchmarks] | guidellm | - | 4 | 0 | 0 |" in text
    assert "time_to_second_token" in text and "request_concurrency" in text  # named, not dropped
