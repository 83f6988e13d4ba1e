"""REPORT.html: self-contained, and in a real headless browser it loads without errors and shows the
curves (a legend entry per strategy), the per-rate tables, the headline and the setup."""
import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app

runner = CliRunner()
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html")
    result = runner.invoke(app, ["simulate", "--strategy", "naive,dynamic", "--rate", "4,8", "--duration", "2",
                                 "--dataset", "synthetic", "--out", str(out)])
    assert result.exit_code == 0, result.output
    server = {"label": "real-server", "backend": "vllm", "request_rate": 6.0, "completed": 10, "failed": 0,
              "request_throughput": 3.0, "output_throughput": 300.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 200.0,
              "median_e2el_ms": 1500.0, "p99_e2el_ms": 2500.0}
    (out / "server.json").write_text(json.dumps(server))
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    return out / "REPORT.html"


def test_the_page_needs_no_network(report):
    page = report.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"?https?:", page)
    assert "Plotly" in page  # the library itself is inlined


def _browser() -> str | None:
    return next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)


@pytest.mark.slow
def test_a_headless_browser_renders_the_page_without_errors(report):
    browser = _browser()
    if browser is None:
        message = ("NO HEADLESS BROWSER: REPORT.html was not checked in a browser; install Debian's chromium "
                   "(.ci/run does: apt-get install -y chromium)")
        warnings.warn(message)
        pytest.skip(message)
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=10000", "--dump-dom", report.as_uri()],
                          capture_output=True, text=True, timeout=180)
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'id="page-errors" data-count="0"' in dom, re.findall(r'id="page-errors".{0,500}', dom)
    assert not re.search(r"CONSOLE.*(Uncaught|Error)", done.stderr), done.stderr[-2000:]
    assert dom.count('class="main-svg"') >= 1  # plotly drew the curves
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', dom)
    assert {"naive", "dynamic"} <= set(legend) and any("real-server" in t for t in legend)
    assert 'id="rate-0"' in dom and 'id="rate-1"' in dom and 'id="external"' in dom
    assert re.search(r'<ul id="headline"><li>[^<]*naive', dom) and '<ul id="setup"><li>CPU' in dom
