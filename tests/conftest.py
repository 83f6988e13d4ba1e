"""Shared fixtures: a private BATCHLAB_HOME cache for the session, and a helper to run the CLI."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
