"""REPORT.html: self-contained, rendered from the blocks REPORT.md is made of (every heading, the capacity
table, the busy-machine line, every plot), and in a real headless browser it loads without errors and shows
them (benchmarks/report_page.py). BATCHLAB_REPORT_PAGE=FOLDER checks a real report folder (a `make run`) the
same way and writes its screenshot (BATCHLAB_REPORT_SHOT, default FOLDER/REPORT.png)."""
import json
import os
import re
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.report.blocks import ReportBlock, markdown, parse
from benchmarks.report_page import browser, check, expected, problems

runner = CliRunner()
BUSY = {"cores": 2, "window_s": 2.0, "other_cores": 1.2, "other_peak_cores": 1.5, "own_cores": 0.8,
        "steal_share": 0.0, "samples": 20}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    result = runner.invoke(app, ["simulate", "--strategy", "naive,dynamic", "--rate", "4,8", "--duration", "2",
                                 "--dataset", "synthetic", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = next(out.rglob("summary.json"))  # one run that a neighbour disturbed: the ⚠ line
    summary.write_text(json.dumps(json.loads(summary.read_text()) | {"interference": BUSY}))
    server = {"label": "real-server", "backend": "vllm", "request_rate": 6.0, "completed": 10, "failed": 0,
              "request_throughput": 3.0, "output_throughput": 300.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 200.0,
              "median_e2el_ms": 1500.0, "p99_e2el_ms": 2500.0}
    (out / "server.json").write_text(json.dumps(server))
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    return out / "REPORT.html"


def test_the_page_needs_no_network(report):
    page = report.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"?https?:|<img[^>]+src=\"(?!data:)", page)
    assert len(re.findall(r"plotly.js v\d", page)) == 1  # the library itself, inlined once for every plot


def test_every_block_of_the_markdown_is_on_the_page(report):
    """Without a browser: every heading, the capacity table's figures, the ⚠ line, each plot's figure."""
    md = (report.parent / "REPORT.md").read_text()
    want = expected(md)
    assert {"Capacity", "Result", "Plots", "Results per rate", "Confidence intervals", "Setup",
            "Other tools' runs", "The machine while it ran"} <= set(want["heading"])
    assert want["busy-machine line"] and want["capacity figure"] and len(want["plot"]) == 5
    page = report.read_text()
    for plot in want["plot"]:  # the five interactive ones
        assert f'data-plot="{plot}"' in page
    assert problems(page.replace('data-count="-1"', 'data-count="0"'), "", md) == [
        f"plot not drawn: {p}" for p in want["plot"]]  # drawn only where a browser runs plotly


def test_a_block_missing_from_the_page_is_named(report):
    md = (report.parent / "REPORT.md").read_text()
    page = report.read_text().replace("<h2>Confidence intervals</h2>", "").replace("⚠ The machine", "The machine")
    found = problems(page, "", md)
    assert "heading missing: Confidence intervals" in found
    assert any(line.startswith("busy-machine line missing") for line in found)


def test_markdown_read_back_into_blocks_is_the_same_text():
    parts = [ReportBlock("Capacity", 2), ReportBlock(head=("strategy", "req/s"), rows=[["a | b", "1.5"]]),
             ReportBlock("a paragraph"), ReportBlock(items=["one", "two"]), ReportBlock("p.png", image="p.png")]
    again = parse("\n".join(markdown(parts)))
    assert [(b.text, b.level, b.head, b.rows, b.items, b.image) for b in again] == [
        (b.text, b.level, b.head, b.rows, b.items, b.image) for b in parts]


def _need_browser() -> None:
    if browser() is None:
        message = ("NO HEADLESS BROWSER: REPORT.html was not checked in a browser; install Debian's chromium "
                   "(.ci/run does: apt-get install -y chromium)")
        warnings.warn(message)
        pytest.skip(message)


@pytest.mark.slow
def test_a_headless_browser_shows_every_block_without_errors(report, tmp_path):
    _need_browser()
    shot = tmp_path / "REPORT.png"
    assert check(report.parent, shot) == []
    assert shot.stat().st_size > 50_000  # a picture of the page, not a blank one


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BATCHLAB_REPORT_PAGE"), reason="BATCHLAB_REPORT_PAGE (a report folder) not set")
def test_a_real_report_folder_shows_every_block_and_keeps_its_screenshot():
    _need_browser()
    folder = Path(os.environ["BATCHLAB_REPORT_PAGE"])
    shot = Path(os.environ.get("BATCHLAB_REPORT_SHOT", folder / "REPORT.png"))
    assert check(folder, shot) == []
