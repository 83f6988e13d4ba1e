"""`batchlab vllm ...` tells vLLM's errors as vLLM's (its exit code, one line, the traceback in a log), and
`batchlab sweep --save-result DIR` writes vLLM's sweep layout (a summary.json list per point folder), which
`vllm bench sweep plot_pareto` draws as it is."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from batchlab import api
from batchlab.cli.main import app
from batchlab.collector.vllm_sweep import point_name, write_vllm_sweep

runner = CliRunner()
BATCHLAB = str(Path(sys.executable).with_name("batchlab"))
PLAN = """base: {{backend: sim, dataset: synthetic, duration_s: 1, max_new_tokens: 16, prompt_lengths: 32-64}}
grid: {{strategies: [naive, dynamic], rates: [4, 8], repeats: {repeats}, seed: 0}}
"""


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> api.SimulationResult:
    out = tmp_path_factory.mktemp("sim")
    return api.simulate(strategy=["naive", "dynamic"], rate=[4, 8], duration_s=1, dataset="synthetic",
                        max_new_tokens=16, out=str(out / "sweep"))


def test_each_point_is_a_folder_with_its_repeats_results_in_a_list(simulated, tmp_path):
    written = write_vllm_sweep(simulated.records, tmp_path / "vllm")
    assert sorted(p.parent.name for p in written) == sorted(
        point_name(r.label, r.backend, r.rate, r.concurrency) for r in simulated.records)
    naive_4 = json.loads((tmp_path / "vllm" / point_name("naive", "sim", 4.0, 0) / "summary.json").read_text())
    assert [(r["label"], r["request_rate"], r["run_number"]) for r in naive_4] == [("naive", 4.0, 0)]
    assert naive_4[0]["output_throughput"] > 0 and "p99_ttft_ms" in naive_4[0]


def test_the_layout_is_refused_where_vllm_would_read_the_sweeps_own_summaries(tmp_path):
    for where in (tmp_path / "out", tmp_path):
        with pytest.raises(api.ConfigError, match="holds the sweep's own folder"):
            api.sweep(yaml.safe_load(PLAN.format(repeats=1)), tmp_path / "out", save_result=where)
    assert not (tmp_path / "out").exists()


@pytest.mark.vllm
@pytest.mark.slow  # vLLM's import alone takes ~10 s
def test_vllms_error_is_vllms_exit_code_and_one_line_not_a_bug_in_batchlab(simulated, tmp_path):
    pytest.importorskip("vllm")
    files = tmp_path / "results"  # --save-result files side by side: no summary.json, which vLLM refuses
    files.mkdir()
    record = simulated.records[0]
    (files / "a.json").write_text((Path(record.folder) / "vllm_result.json").read_text())
    done = subprocess.run([BATCHLAB, "vllm", "bench", "sweep", "plot_pareto", str(files)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1 and "bug in batchlab" not in done.stderr and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: vllm: ValueError: Did not find any parameter sweep results under")
    log = Path(line.rpartition("its traceback: ")[2].rstrip(")"))
    assert "Traceback" in log.read_text() and "plot_pareto" in log.read_text()
    log.unlink()


@pytest.mark.vllm
@pytest.mark.slow
def test_plot_pareto_draws_a_folder_batchlab_sweep_save_result_wrote(tmp_path):
    pytest.importorskip("vllm")
    pytest.importorskip("seaborn")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(repeats=1))
    result = runner.invoke(app, ["sweep", str(plan), "--out", str(tmp_path / "out"), "--save-result",
                                 str(tmp_path / "vllm")])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "vllm").glob("*/summary.json"))) == 4
    done = subprocess.run([BATCHLAB, "vllm", "bench", "sweep", "plot_pareto", str(tmp_path / "vllm")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Plotted 4 points" in done.stdout
    png = tmp_path / "vllm" / "pareto" / "PARETO.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
