"""--save-result and vllm_result.json carry vllm bench serve's keys; the report reads vLLM's result files."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.collector.layout import point_of
from batchlab.collector.vllm_result import save_result

runner = CliRunner()
FAST = ["--duration", "2", "--dataset", "synthetic", "--rate", "6"]
# The keys vLLM's own consumers read: save_to_pytorch_benchmark_format's metric list (vllm/benchmarks/serve.py),
# sweep/serve_workload.py (request_throughput, mean_e2el_ms) and sweep/plot.py (total_token_throughput,
# median_ttft_ms); the rest are the setup and count keys `vllm bench serve` writes.
VLLM_KEYS = ["median_ttft_ms", "mean_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
             "std_tpot_ms", "p99_tpot_ms", "median_itl_ms", "mean_itl_ms", "std_itl_ms", "p99_itl_ms",
             "request_throughput", "mean_e2el_ms", "total_token_throughput", "date", "backend", "model_id",
             "tokenizer_id", "num_prompts", "request_rate", "max_concurrency", "duration", "completed",
             "total_input_tokens", "total_output_tokens", "request_goodput", "output_throughput"]
# a script as a user writes it for vLLM's result files
SCRIPT = """
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['model_id']} @ {r['request_rate']} req/s: {r['completed']}/{r['num_prompts']} in {r['duration']:.2f} s")
print(f"throughput {r['request_throughput']:.3f} req/s, {r['output_throughput']:.1f} out tok/s, "
      f"{r['total_token_throughput']:.1f} tok/s")
for m in ('ttft', 'tpot', 'itl', 'e2el'):
    print(f"{m}: mean {r[f'mean_{m}_ms']:.2f} median {r[f'median_{m}_ms']:.2f} p99 {r[f'p99_{m}_ms']:.2f} ms")
"""


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    result = runner.invoke(app, ["simulate", *FAST, "--slo", "ttft=300ms", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_a_script_for_vllm_results_reads_the_saved_result(run_folder, tmp_path):
    path = save_result(run_folder, tmp_path / "result.json")
    data = json.loads(path.read_text())
    assert [k for k in VLLM_KEYS if k not in data] == []
    script = tmp_path / "read.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tiny-mistral @ 6.0 req/s" in done.stdout and "p99" in done.stdout


def test_the_result_keys_cover_what_vllm_itself_reads():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed: its own key list cannot be read")
    source = (Path(list(spec.submodule_search_locations)[0]) / "benchmarks" / "serve.py").read_text()
    block = re.search(r"def save_to_pytorch_benchmark_format.*?metrics = \[(.*?)\]", source, re.S)
    assert block, "vLLM's save_to_pytorch_benchmark_format changed shape"
    assert set(re.findall(r'"(\w+)"', block.group(1))) <= set(VLLM_KEYS)


def test_the_result_figures_are_batchlabs_own_in_vllms_units(run_folder, tmp_path):
    data = json.loads(save_result(run_folder, tmp_path / "r.json").read_text())
    summary = json.loads((run_folder / "summary.json").read_text())
    assert data["mean_ttft_ms"] == pytest.approx(summary["ttft"]["mean"] * 1e3)
    assert data["p99_e2el_ms"] == pytest.approx(summary["e2e"]["p99"] * 1e3)
    assert data["p50_itl_ms"] == pytest.approx(summary["itl"]["p50"] * 1e3)
    assert data["output_throughput"] == pytest.approx(summary["throughput_tok_s"])
    assert data["request_throughput"] == pytest.approx(summary["requests_per_s"])
    assert data["request_goodput"] == pytest.approx(summary["goodput"]["met"] / summary["window_s"])
    assert data["completed"] == summary["finished"] and data["num_prompts"] == summary["scheduled"]
    assert {"tpot", "itl", "duration"} <= set(data["batchlab_definitions"])


def vllm_file(path: Path, label: str, rate: object = 6.0) -> Path:
    """A result file as vllm bench serve writes it (its setup and default percentile keys)."""
    data = {"date": "20260101-120000", "backend": "vllm", "label": label, "model_id": "m", "tokenizer_id": "m",
            "num_prompts": 50, "request_rate": rate, "burstiness": 1.0, "max_concurrency": None, "duration": 10.0,
            "completed": 48, "failed": 2, "total_input_tokens": 9000, "total_output_tokens": 4000,
            "request_throughput": 4.8, "request_goodput": None, "output_throughput": 400.0,
            "total_token_throughput": 1300.0}
    for m, base in (("ttft", 80.0), ("tpot", 12.0), ("itl", 11.0), ("e2el", 900.0)):
        data |= {f"mean_{m}_ms": base, f"median_{m}_ms": base, f"std_{m}_ms": 1.0, f"p99_{m}_ms": base * 2}
    path.write_text(json.dumps(data))
    return path


def test_report_places_vllm_results_beside_the_strategies(run_folder, tmp_path):
    given = vllm_file(tmp_path / "server-run.json", "real-server")
    vllm_file(run_folder / "found.json", "found-in-folder", rate="inf")
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(given)])
    assert result.exit_code == 0, result.output
    text = (run_folder / "REPORT.md").read_text()
    table = text.split("## Other tools' runs")[1]
    assert "real-server [server-run] | vllm bench serve | 6 | 48 | 2" in table
    assert "found-in-folder [found] | vllm bench serve | inf" in table
    assert "80.0 / 160.0" in table  # TTFT p50 / p99, ms as the file gave them


def test_an_extra_file_that_is_no_vllm_result_is_one_line(run_folder, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(bad)])
    assert result.exit_code == 1 and "not a result file batchlab reads" in result.output


@pytest.mark.slow  # real processes through the CLI
def test_run_save_result_writes_vllm_keys(tmp_path):
    path = tmp_path / "res.json"
    result = runner.invoke(app, ["run", "--backend", "sim", *FAST, "--num-requests", "8", "--out",
                                 str(tmp_path / "run"), "--save-result", str(path)])
    assert result.exit_code == 0, result.output
    data = json.loads(path.read_text())
    assert [k for k in VLLM_KEYS if k not in data] == [] and data["completed"] == 8


def test_a_sweep_point_gains_its_vllm_result_and_a_broken_one_a_note(run_folder, tmp_path):
    from batchlab.collector.vllm_result import point_result

    point_result(run_folder)
    assert json.loads((run_folder / "vllm_result.json").read_text())["completed"] > 0
    (tmp_path / "summary.json").write_text("{}")
    point_result(tmp_path)
    assert not (tmp_path / "vllm_result.json").exists() and (tmp_path / "vllm_result.error.txt").exists()


def test_a_simulated_sweep_writes_a_vllm_result_per_point(tmp_path):
    result = runner.invoke(app, ["simulate", "--strategy", "naive,dynamic", "--rate", "4", "--duration", "1",
                                 "--dataset", "synthetic", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = tmp_path.glob("sweep_label=*/sweep_rate=4/sweep_repeat=0/vllm_result.json")
    found = sorted(point_of(p.parent)[0] for p in files)
    assert found == ["dynamic", "naive"]


def _saved(tmp_path: Path, name: str, *flags: str) -> dict:
    """A simulated run's result as --save-result writes it."""
    out = tmp_path / name
    result = runner.invoke(app, ["simulate", "--duration", "2", "--dataset", "synthetic", *flags, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(save_result(out, tmp_path / f"{name}.json").read_text())


def test_the_concurrency_and_arrival_keys_mean_what_vllm_means(tmp_path):
    """max_concurrency is the cap on requests in flight (vLLM's --max-concurrency), never the observed peak;
    burstiness is the gamma shape, null for arrivals that are no gamma process."""
    closed = _saved(tmp_path, "closed", "--concurrency", "3")
    constant = _saved(tmp_path, "constant", "--rate", "6", "--arrival", "constant")
    poisson = _saved(tmp_path, "poisson", "--rate", "6")
    gamma = _saved(tmp_path, "gamma", "--rate", "6", "--arrival", "gamma", "--burstiness", "0.5")
    assert closed["max_concurrency"] == 3 and closed["burstiness"] is None
    assert constant["max_concurrency"] is None and constant["burstiness"] is None  # the sim backend caps nothing
    assert poisson["burstiness"] == 1.0 and gamma["burstiness"] == 0.5
    for data in (closed, constant, poisson):
        assert data["endpoint_type"] == data["backend"] == "sim"
        assert len(data["latencies"]) == len(data["queue_times"]) == data["completed"] > 0
        assert sum(data["latencies"]) / len(data["latencies"]) * 1e3 == pytest.approx(data["mean_e2el_ms"])
        assert 1 <= data["max_concurrent_requests"] <= data["completed"]
        assert 0 < data["max_output_tokens_per_s"] <= data["total_output_tokens"]


@pytest.mark.slow  # importing vLLM takes a minute on a loaded 2-core machine
def test_vllms_plot_pareto_keeps_batchlabs_runs(tmp_path, capsys):
    """vLLM's own loader of `vllm bench sweep plot_pareto` reads the saved results as its sweep writes them (a
    summary.json list per run folder) and keeps every run: each has a user count."""
    pareto = pytest.importorskip("vllm.benchmarks.sweep.plot_pareto")
    runs = [_saved(tmp_path, "closed", "--concurrency", "3"), _saved(tmp_path, "open", "--rate", "6")]
    sweep = tmp_path / "sweep"
    for i, data in enumerate(runs):
        (sweep / f"run-{i}").mkdir(parents=True)
        (sweep / f"run-{i}" / "summary.json").write_text(json.dumps([data]))
    prepared, skipped = pareto._prepare_records(runs, user_count_var="max_concurrency", gpu_count_var=None)
    assert skipped == 0 and [r["user_count_estimate"] for r in prepared] == [3, runs[1]["max_concurrent_requests"]]
    pareto.plot_pareto(sweep, "max_concurrency", None, [], dry_run=True)
    assert "Skipped" not in capsys.readouterr().out


def test_the_detailed_lists_are_vllms_save_detailed_per_finished_request(run_folder, tmp_path):
    """vLLM's --save-detailed lists, one entry per finished request, each request's gaps summing to its span."""
    plain = json.loads(save_result(run_folder, tmp_path / "plain.json").read_text())
    data = json.loads(save_result(run_folder, tmp_path / "detailed.json", detailed=True).read_text())
    lists = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")
    assert not set(lists) & set(plain)
    assert {len(data[k]) for k in lists} == {data["completed"]}
    assert sum(data["input_lens"]) == data["total_input_tokens"]
    assert sum(data["output_lens"]) == data["total_output_tokens"]
    assert [len(gaps) for gaps in data["itls"]] == [n - 1 for n in data["output_lens"]]
    assert sum(data["ttfts"]) / len(data["ttfts"]) * 1e3 == pytest.approx(data["mean_ttft_ms"])
    for ttft, gaps, e2e in zip(data["ttfts"], data["itls"], data["latencies"]):
        assert ttft + sum(gaps) == pytest.approx(e2e)
