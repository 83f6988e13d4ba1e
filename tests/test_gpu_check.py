"""benchmarks/gpu_check: the GPU plan it runs, its phases under a deadline, its shell wrapper, and a dry run
of every phase on the CPU (in-process; the calibrations, tested on their own, stood in for by presets)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import gpu_check
from benchmarks.gpu_check import render

ROOT = Path(__file__).resolve().parent.parent
FULL = yaml.safe_load((ROOT / "configs" / "full.yaml").read_text())


def test_the_gpu_plan_is_full_yamls_hf_strategies_at_its_rates_in_short_points():
    plan = gpu_check.gpu_plan(FULL, "mistral-7b-v0.1:random", "cuda", [5, 20, 50], 8.0, False, {"dataset": "synthetic"})
    labels = [s if isinstance(s, str) else s["label"] for s in plan["grid"]["strategies"]]
    assert labels == ["naive", "dynamic", "continuous"]  # no vllm: its CUDA wheel cannot travel
    assert plan["grid"]["rates"] == [5, 20, 50] and plan["grid"]["repeats"] == 1
    base = plan["base"]
    assert base["model"] == "mistral-7b-v0.1:random" and base["duration_s"] == 8.0 and base["backend"] == "hf"
    assert base["max_batch_size"] == FULL["base"]["max_batch_size"] and base["max_wait_ms"] == FULL["base"]["max_wait_ms"]
    assert base["max_new_tokens"] < FULL["base"]["max_new_tokens"] and base["max_queue"] > 0  # short points drain


def test_the_shipped_gpu_presets_are_found_for_this_gpu_and_a_random_architecture():
    assert gpu_check.shipped_presets("NVIDIA H200", "mistral-7b-v0.1:random") == {
        "static": "h200-mistral-7b-hf", "continuous": "h200-mistral-7b-hf-loop"}
    assert gpu_check.shipped_presets("NVIDIA A100-SXM4-80GB", "tinyllama-1.1b:random")["static"] == \
        "a100-80gb-tinyllama-1.1b-hf"
    assert gpu_check.shipped_presets("NVIDIA GeForce RTX 3090", "llama-3.1-8b:random")["continuous"] == \
        "rtx3090-llama-3.1-8b-hf-loop"
    assert gpu_check.shipped_presets("none", "mistral-7b-v0.1:random") is None  # no GPU, or one with no preset
    assert gpu_check.shipped_presets("NVIDIA H100 80GB HBM3", "tiny-mistral") is None  # a model with no preset


def test_the_plan_simulates_with_the_shipped_gpu_presets(tmp_path):
    plan = gpu_check.gpu_plan(FULL, "tiny-mistral", "cpu", [5.0], 1.0, True, {"dataset": "synthetic"})
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    rows = gpu_check.simulate_plan(plan_file, gpu_check.shipped_presets("NVIDIA H200", "mistral-7b-v0.1:random"),
                                   tmp_path / "simulated-shipped")
    assert {r["label"] for r in rows} == {"naive", "dynamic", "continuous"}
    assert all(r["finished"] == r["submitted"] > 0 for r in rows)
    config = next((tmp_path / "simulated-shipped" / "sweep_label=continuous").glob("*/*/config.yaml"))
    played = yaml.safe_load(config.read_text())["preset"]
    assert played == "h200-mistral-7b-hf-loop"


def test_simulated_points_are_set_beside_their_live_twins():
    live = [{"label": "naive", "rate": 5.0, "throughput_tok_s": 100.0, "ttft_p50": 0.2, "e2e_p50": 2.0},
            {"label": "dynamic", "rate": 5.0, "throughput_tok_s": 120.0, "ttft_p50": 0.1, "e2e_p50": None}]
    simulated = [{"label": "naive", "rate": 5.0, "throughput_tok_s": 110.0, "ttft_p50": 0.1, "e2e_p50": 3.0},
                 {"label": "dynamic", "rate": 5.0, "throughput_tok_s": 60.0, "ttft_p50": 0.1, "e2e_p50": 1.0},
                 {"label": "naive", "rate": 20.0, "throughput_tok_s": 1.0, "ttft_p50": 1.0, "e2e_p50": 1.0}]
    errors = gpu_check.against_live(live, simulated)
    assert [(e["label"], e["rate"]) for e in errors] == [("naive", 5.0), ("dynamic", 5.0)]  # no live twin: left out
    assert errors[0]["throughput_tok_s"] == pytest.approx(0.1) and errors[0]["ttft_p50"] == pytest.approx(-0.5)
    assert errors[1]["throughput_tok_s"] == pytest.approx(-0.5) and errors[1]["e2e_p50"] is None


def test_a_failed_phase_is_one_line_and_a_late_one_is_skipped():
    phases = gpu_check.Phases(deadline_s=3600)
    assert phases.run("works", lambda: 7) == 7
    assert phases.run("breaks", lambda: 1 / 0) is None
    phases.deadline_s = -1
    assert phases.run("late", lambda: 7) is None
    assert [(p["phase"], p["status"]) for p in phases.log] == [("works", "ok"), ("breaks", "failed"), ("late", "skipped")]
    assert phases.log[1]["why"] == "ZeroDivisionError: division by zero"


def test_the_report_names_missing_modules_and_every_phase():
    facts = {"environment": {"python": "3.11", "device": "cuda", "gpu": "H200", "modules": {"zmq": False, "torch": True}},
             "phases": [{"phase": "sweep", "status": "failed", "seconds": 1.0, "why": "RunFailed: worker died"}],
             "calibrations": {}, "live": [], "simulated": None}
    text = render(facts)
    assert "missing modules: zmq" in text and "| sweep | failed | 1.0 | RunFailed: worker died |" in text


def test_the_report_sets_the_shipped_presets_beside_the_live_points():
    point = {"label": "naive", "rate": 5.0, "finished": 40, "submitted": 40, "throughput_tok_s": 110.0,
             "ttft_p50": 0.1, "e2e_p50": 3.0}
    facts = {"environment": {"python": "3.11", "device": "cuda", "gpu": "NVIDIA H200", "modules": {}}, "phases": [],
             "calibrations": {}, "live": [], "simulated": None,
             "shipped_presets": {"static": "h200-mistral-7b-hf", "continuous": "h200-mistral-7b-hf-loop"},
             "simulated_shipped": [point], "shipped_error": [{"label": "naive", "rate": 5.0, "throughput_tok_s": 0.1,
                                                               "ttft_p50": -0.5, "e2e_p50": None}]}
    text = render(facts)
    assert "## Simulated with the shipped GPU presets (h200-mistral-7b-hf, h200-mistral-7b-hf-loop)" in text
    assert "| naive | 5 | +10.0% | -50.0% | - |" in text


def test_the_check_calibrates_each_mode_through_the_calibrate_command(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr("batchlab.lab.calibrate.run_calibrate", lambda *a: calls.append(a) or {"wall_s": 1.0})
    args, out = gpu_check.parse_args(["--device", "cpu", "--dry-run"]), tmp_path / "tiny-mistral-hf-loop.yaml"
    assert gpu_check.calibrate("tiny-mistral", "continuous", args, out) == {"wall_s": 1.0}
    assert calls == [("hf", "tiny-mistral", "cpu", "auto", "continuous", "auto", str(out),
                      gpu_check.calibration_grid(True), "tiny-mistral-hf-loop")]


def test_the_shell_wrapper_runs_the_check_from_this_checkout(tmp_path):
    """gpu_check.sh without carried wheels: this checkout linked as the batchlab package, the check run under
    its time limit; a deadline already past skips every phase, so only the wrapper and the report are paid."""
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WHEELS": str(tmp_path / "no-wheels"),
           "GPU_CHECK_SRC": str(tmp_path / "src"), "GPU_CHECK_TIMEOUT_S": "300"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--device", "cpu", "--dry-run",
                           "--deadline-s", "-1", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=360)
    assert "no .whl/ folder: using the packages installed here" in done.stdout, done.stderr[-3000:]
    assert (tmp_path / "src" / "batchlab").resolve() == ROOT
    facts = json.loads((out / "gpu_check.json").read_text())
    assert [(p["phase"], p["status"]) for p in facts["phases"]] == [
        (name, "skipped") for name in ("calibrate tiny-mistral hf", "calibrate tiny-mistral hf-loop", "sweep",
                                       "calibrate --from the sweep", "report")]
    assert done.returncode == 1  # a skipped phase is not a passed check
    assert facts["environment"]["modules"]["zmq"] and (out / "GPU_CHECK.md").is_file()


def preset_of(name: str):
    """A stand-in for a calibration (tested on tiny-mistral in tests/test_calibrate.py): the project's fitted
    preset of that kind written to the path, and the record's figures the check reads."""
    from batchlab.worker.stepmodel import get_preset, save_preset

    def fake(_model: str, _mode: str, _args, out: Path) -> dict:
        record = {"device": "cpu", "wall_s": 0.1, "fit_error": 0.0, "held_out_error": 0.0, "unsettled_samples": 0}
        save_preset(get_preset(name), out, {"backend": "hf", **record})
        return record

    return fake


def landed(runs: dict[str, Path]):
    """A stand-in for a point's live run (launch_run): the session's HF run of that strategy (tests/conftest.py)
    copied into the point's folder; its summary."""
    from batchlab.collector.summary import read_summary

    def launch(cfg, **_kwargs):
        shutil.copytree(runs[cfg.strategy], cfg.out, dirs_exist_ok=True)
        return read_summary(Path(cfg.out))

    return launch


@pytest.mark.slow
def test_a_dry_run_on_the_cpu_plays_every_phase(tmp_path, monkeypatch, hf_static_runs, hf_continuous_run):
    """In-process, each expensive step stood in for by what is tested on its own: the calibrations by fitted
    presets, each point's live run by the session's HF run of its strategy. The plan, the sweep's
    bookkeeping, its simulation, the error split, `calibrate --from` the sweep and the report are real."""
    fakes = {"static": preset_of("cpu-tiny-mistral"), "continuous": preset_of("cpu-tiny-mistral-loop")}
    monkeypatch.setattr(gpu_check, "calibrate", lambda model, mode, args, out: fakes[mode](model, mode, args, out))
    monkeypatch.setattr("batchlab.lab.sweep_point.launch_run",
                        landed({**hf_static_runs, "continuous": hf_continuous_run}))
    monkeypatch.setattr("batchlab.runner.pool.PoolKeeper.for_config", lambda _self, _cfg: None)  # no warm workers
    out = tmp_path / "out"
    code = gpu_check.main(["--device", "cpu", "--dry-run", "--deadline-s", "3600", "--out", str(out)])
    facts = json.loads((out / "gpu_check.json").read_text())
    phases = {p["phase"]: p["status"] for p in facts["phases"]}
    assert phases == dict.fromkeys(["calibrate tiny-mistral hf", "calibrate tiny-mistral hf-loop", "sweep", "simulate",
                                    "split", "calibrate --from the sweep", "report"], "ok"), facts["phases"]
    assert code == 0
    assert {p["label"] for p in facts["live"]} == {"naive", "dynamic", "continuous"}
    assert "## Error split by cause" in (out / "GPU_CHECK.md").read_text()
    assert (out / "presets" / "tiny-mistral-hf-loop.yaml").is_file() and (out / "sweep" / "REPORT.md").is_file()
    assert {p["label"] for p in facts["simulated"]} == {"naive", "dynamic", "continuous"}
