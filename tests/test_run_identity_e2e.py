"""Real runs on the sim backend: the end-of-run table, its overload warning, progress lines in a log,
what run.json and the summary record, and a resumed sweep that notices a changed config."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BATCHLAB = [sys.executable, "-m", "batchlab.cli.main"]


def batchlab(*args: str, cwd: Path, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    return subprocess.run([*BATCHLAB, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=env)


# a100 preset, dynamic capped at 2 rows: about 3 req/s of capacity against 40 offered
OVERLOADED = ("run", "--backend", "sim", "--strategy", "dynamic", "--max-batch-size", "2", "--dataset", "synthetic",
              "--rate", "40", "--duration", "1.5")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, list]:
    """The overloaded run twice without --out, from one folder: that folder and both runs' results."""
    cwd = tmp_path_factory.mktemp("cwd")
    return cwd, [batchlab(*OVERLOADED, cwd=cwd), batchlab(*OVERLOADED, cwd=cwd)]


def test_an_overloaded_run_ends_with_its_figures_and_a_warning(two_runs):
    cwd, (result, _) = two_runs
    assert result.returncode == 0, result.stderr
    run = cwd / "runs" / sorted(p.name for p in (cwd / "runs").iterdir())[0]  # the first: names sort by time
    out = result.stdout
    for figure in ("requests finished / scheduled", "offered rate (req/s)", "served rate (req/s)",
                   "output throughput (tok/s)", "TTFT p50 / p90 / p99 (ms)", "TPOT p50", "ITL p50", "E2E p50"):
        assert figure in out
    assert "warning: overloaded: served" in " ".join(result.stderr.split())
    # not a terminal: progress is logged as lines, with a phase and the counts
    progress = [ln for ln in result.stderr.splitlines() if "dynamic/sim λ=40 req/s" in ln]
    assert progress and all(" · in flight " in ln for ln in progress)
    assert any(p in ln for ln in progress for p in ("starting", "sending", "draining"))
    record = json.loads((run / "run.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert record["status"] == "done" and record["config_hash"] == summary["settings"]["config_hash"]
    assert record["started_utc"].endswith("Z") and record["batchlab"]["version"]
    worker_env = summary["settings"]["workers"]["worker-0"]["environment"]  # each role reports its own
    assert worker_env["cpu_count"] and "numpy" in worker_env["libraries"]
    assert summary["settings"]["environment"]["host"] == worker_env["host"]
    assert "timing_fidelity" in summary and "p99" in summary["harness_lag"]  # computed when the run ended


def test_a_run_without_out_gets_its_own_folder_and_a_reused_one_is_refused(two_runs):
    cwd, (first, second) = two_runs
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    folders = sorted(p.name for p in (cwd / "runs").iterdir())
    assert len(folders) == 2 and all("dynamic-sim" in f for f in folders)
    again = batchlab(*OVERLOADED, "--out", f"runs/{folders[0]}", cwd=cwd)
    assert again.returncode == 1 and "already holds a run" in again.stderr


def in_process(*args: str) -> str:
    """A command in this process (a sweep still starts its roles): its output; it must exit 0."""
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_resumed_sweep_measures_again_the_points_whose_config_changed(tmp_path):
    sweep, out = tmp_path / "sweep.yaml", str(tmp_path / "s")
    text = ("base: {backend: sim, dataset: synthetic, duration_s: 1, max_new_tokens: 16}\n"
            "grid: {strategies: [naive, dynamic], rates: [20]}\n")
    sweep.write_text(text)
    in_process("sweep", str(sweep), "--out", out)
    sweep.write_text(text.replace("max_new_tokens: 16", "max_new_tokens: 8"))
    assert "max_new_tokens 16 → 8" in in_process("sweep", str(sweep), "--out", out)
    index = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert [p["status"] for p in index["points"]] == ["done", "done"]  # measured again, not skipped
    for point in index["points"]:
        settings = json.loads((tmp_path / "s" / point["dir"] / "summary.json").read_text())["settings"]
        assert settings["max_new_tokens"] == index["base"]["max_new_tokens"] == 8  # the index describes its data
    unchanged = in_process("sweep", str(sweep), "--out", out)
    assert [p["status"] for p in json.loads((tmp_path / "s" / "sweep.json").read_text())["points"]] == \
        ["skipped", "skipped"], unchanged
