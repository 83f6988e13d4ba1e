"""Shared fixtures: a private BATCHLAB_HOME cache for the session, and a helper to run the CLI; with
BATCHLAB_REQUIRE_VLLM=1 (`make test`) a test skipped because vllm cannot be imported fails instead."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_VLLM_ENV = "BATCHLAB_REQUIRE_VLLM"
VLLM_SKIP = "could not import 'vllm'"  # the reason pytest.importorskip("vllm") gives


_missing_vllm: list[str] = []  # files skipped at collection for a missing vllm (BATCHLAB_REQUIRE_VLLM=1)


def _skipped_for_vllm(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The skip reason when `report` is a skip for a missing vllm under BATCHLAB_REQUIRE_VLLM=1, else ""."""
    if os.environ.get(REQUIRE_VLLM_ENV) != "1" or not report.skipped:
        return ""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason if VLLM_SKIP in reason else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's own importorskip("vllm") fails the test."""
    report = (yield).get_result()
    if reason := _skipped_for_vllm(report):
        report.outcome = "failed"
        report.longrepr = f"{reason} ({REQUIRE_VLLM_ENV}=1: install the vllm extra)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module-level importorskip("vllm") skips a whole file: the file is noted, the session fails at
    its end (a failed collection would stop every other test)."""
    report = (yield).get_result()
    if _skipped_for_vllm(report):
        _missing_vllm.append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    """Name the files that could not run for a missing vllm."""
    for nodeid in _missing_vllm:
        terminalreporter.write_line(f"FAILED {nodeid}: vllm cannot be imported and {REQUIRE_VLLM_ENV}=1", red=True)


def pytest_sessionfinish(session, exitstatus):
    """A missing vllm fails the run under BATCHLAB_REQUIRE_VLLM=1, even when every collected test passed."""
    if _missing_vllm and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def batchlab_home(tmp_path_factory):
    """Tests share one cache (models, parsed ShareGPT) unless BATCHLAB_HOME is already set (CI)."""
    if not os.environ.get("BATCHLAB_HOME"):
        os.environ["BATCHLAB_HOME"] = str(Path.home() / ".cache" / "batchlab")
    return Path(os.environ["BATCHLAB_HOME"])


def default_sigint() -> None:
    """preexec_fn for a child a test will send SIGINT: a shell that starts jobs without job control (a CI
    script's background step) makes them ignore SIGINT, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, timeout_s: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m cli.main ARGS` from the repository root; output captured."""
    proc = subprocess.run([sys.executable, "-m", "batchlab.cli.main", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise AssertionError(f"batchlab {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc
