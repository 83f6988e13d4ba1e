"""A run folder, a resumed point and a pooled report each know which configuration made them."""
import errno
import json
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from batchlab.cli.main import app
from batchlab.runner import run_folder
from batchlab.runner.run_folder import ROLE_FILES, RunRecord, claim, new_folder, release
from batchlab.lab.simulate import simulate_run
from batchlab.lab.sweep_plan import Entry, Point
from batchlab.lab.sweep_point import stale_point
from batchlab.report.points import ReportError, load_collection
from batchlab.protocol.identity import config_hash, differences, identity
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.collector.layout import point_dir

runner = CliRunner()
FAST = {"backend": "sim", "dataset": "synthetic", "rate": 20.0, "duration_s": 1.0, "max_new_tokens": 8}


@contextmanager
def _nothing_launched():
    """No process may start inside (launch_run fails the test); yields the CPU seconds spent so far. CPU
    time, not wall time: the check's own work, whatever else shares the machine."""
    import batchlab.runner.launcher as launcher  # where `run` (batchlab.api.run) takes launch_run from

    def launched(*_args, **_kwargs):
        raise AssertionError("a run was launched before its settings were checked")

    start_s, saved = time.process_time(), launcher.launch_run
    launcher.launch_run = launched
    try:
        yield lambda: time.process_time() - start_s
    finally:
        launcher.launch_run = saved


def _sim(folder: Path, **settings) -> None:
    cfg = RunConfig(**{**FAST, **settings, "out": str(folder)}).validate()
    folder.mkdir(parents=True, exist_ok=True)
    simulate_run(cfg)


def test_the_hash_ignores_where_a_run_went_and_nothing_it_measured():
    a = RunConfig(out="runs/a", seed=1).as_settings()
    assert config_hash(a) == config_hash(RunConfig(out="elsewhere", seed=1).as_settings())
    assert config_hash(a) != config_hash(RunConfig(out="runs/a", seed=2).as_settings())
    assert config_hash(a, ignore=frozenset({"seed"})) == config_hash(RunConfig(seed=2).as_settings(),
                                                                   ignore=frozenset({"seed"}))
    assert differences(a, RunConfig(preset="x", seed=1).as_settings()) == ["preset 'a100-llama2-7b' → 'x'"]


def test_the_default_settings_and_their_hash_stay_those_earlier_runs_recorded():
    settings = RunConfig().as_settings()  # a changed default or key would make resumed sweeps refuse every point
    assert config_hash(settings) == "9d50e6a08b2dafd4"  # cpu_threads, speed_drift(_s), neighbour_* added
    assert len(settings) == 56 and (settings["rate"], settings["slo"], settings["strategy_args"]) == (10.0, [], {})


def test_a_setting_added_later_keeps_older_records_equal_at_its_default():
    older = RunConfig(seed=1).as_settings()
    del older["max_queue_tokens"]  # as a summary written before the field existed
    assert identity(older) == identity(RunConfig(seed=1).as_settings())
    assert differences(older, RunConfig(seed=1, max_queue_tokens=5).as_settings()) == ["max_queue_tokens 0 → 5"]


def test_identity_survives_the_summary_round_trip(tmp_path):
    cfg = RunConfig(**FAST, strategy="dynamic", strategy_args={"max_wait_ms": 20}, out=str(tmp_path)).validate()
    recorded = json.loads(json.dumps(cfg.as_settings()))
    recorded["workers"] = {"worker-0": {"backend": "sim"}}  # how the collector records the workers
    assert identity(recorded) == identity(cfg.as_settings())


def test_a_used_folder_is_refused_in_one_line_before_anything_starts(tmp_path):
    RunRecord(tmp_path, RunConfig(strategy="continuous"))
    with _nothing_launched() as cpu_s:
        result = runner.invoke(app, ["run", "--backend", "sim", "--strategy", "dynamic", "--out", str(tmp_path)])
    assert result.exit_code == 1 and cpu_s() < 2.0
    line, = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --out {tmp_path} already holds a run (continuous on sim") and "--overwrite" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.json.reserve", "run.json"]  # untouched


def test_overwrite_empties_the_folder_first(tmp_path):
    (tmp_path / "steps.parquet").write_text("an old run's steps")
    (tmp_path / "logs").mkdir()
    with pytest.raises(ConfigError, match="already holds files"):
        claim(str(tmp_path), overwrite=False)
    assert claim(str(tmp_path), overwrite=True) == tmp_path and not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="must name a folder"):
        claim("", overwrite=True)


def test_the_collector_alone_tolerates_its_sibling_roles_logs_but_not_an_old_runs_tables(tmp_path):
    """The roles of one run started alone share --out: the scheduler's or worker's logs/ (and traffic's
    schedule) may be there before the collector claims it; a run's tables may not."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "scheduler.log").write_text("started")
    (tmp_path / "schedule.parquet").write_text("traffic's schedule")
    assert claim(str(tmp_path), overwrite=False, tolerate=ROLE_FILES) == tmp_path
    assert (tmp_path / "logs" / "scheduler.log").exists()
    with pytest.raises(ConfigError, match="already holds files"):
        claim(str(tmp_path), overwrite=False)  # `run` claims a folder for every role: nothing tolerated
    (tmp_path / "requests.parquet").write_text("an old run's requests")
    with pytest.raises(ConfigError, match="already holds files"):
        claim(str(tmp_path), overwrite=False, tolerate=ROLE_FILES)
    claim(str(tmp_path), overwrite=True, tolerate=ROLE_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "schedule.parquet"]


def test_without_out_each_run_gets_a_new_folder_even_two_in_the_same_second(tmp_path):
    cfg = RunConfig(strategy="dynamic", backend="sim")
    first = Path(new_folder(cfg, str(tmp_path)))  # made at once: a second run of the same second sees it
    second = Path(new_folder(cfg, str(tmp_path)))
    assert first != second and first.parent == second.parent == tmp_path and "dynamic-sim" in first.name
    assert first.is_dir() and second.is_dir() and not any(first.iterdir())


HOLD_CLAIM = """
import sys, time
from batchlab.runner.run_folder import claim
claim(sys.argv[1], overwrite=False)
print("claimed", flush=True)
time.sleep(600)
"""


def test_a_folder_another_live_process_claimed_is_refused_until_that_process_ends(tmp_path):
    """Two runs into one --out started together: both find it empty; the claim's lock lets one in."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(tmp_path / "out")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(ConfigError, match="is in use by another run that is still going"):
            claim(str(tmp_path / "out"), overwrite=True)  # not even --overwrite takes a live run's folder
    finally:
        holder.kill()
        holder.wait()
    assert claim(str(tmp_path / "out"), overwrite=False) == tmp_path / "out"  # the holder's end freed it
    release(tmp_path / "out")


def test_run_json_gets_its_final_status_when_the_run_filled_the_disk(tmp_path, monkeypatch):
    record = RunRecord(tmp_path, RunConfig(**FAST))
    assert (tmp_path / ".run.json.reserve").stat().st_size >= 4 * (tmp_path / "run.json").stat().st_size
    real_write = run_folder.write_json_atomic

    def full_disk_but_for_the_reserve(path, data, **kwargs):  # room only once the reserve is given back
        if (tmp_path / ".run.json.reserve").exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, data, **kwargs)

    monkeypatch.setattr(run_folder, "write_json_atomic", full_disk_but_for_the_reserve)
    record.end("failed", "collector could not write: No space left on device")
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "failed"
    assert not (tmp_path / ".run.json.reserve").exists()


@pytest.mark.parametrize("args, message", [
    (["--backend", "sim", "--preset", "nosuch"], "error: --preset: unknown sim preset 'nosuch'"),
    (["--backend", "hf", "--model", "no/such-model"], "error: --model no/such-model is neither a local folder"),
    (["--backend", "hf", "--model", "./no/such/folder"], "error: --model ./no/such/folder: no such folder"),
    (["--backend", "hf", "--model", "nosuch:random"], "error: --model: unknown architecture 'nosuch'"),
])
def test_a_bad_preset_or_model_fails_within_2_s_with_one_line_and_no_folder(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    out = tmp_path / "run"
    with _nothing_launched() as cpu_s:
        result = runner.invoke(app, ["run", *args, "--out", str(out)])
    assert result.exit_code == 1 and cpu_s() < 2.0
    line, = result.stderr.strip().splitlines()
    assert line.startswith(message), line
    assert not out.exists()


def test_a_worker_alone_checks_its_model_before_loading_it(monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    result = runner.invoke(app, ["worker", "--backend", "hf", "--model", "no/such-model"])
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("error: --model no/such-model is neither a local folder")


def _point(tmp_path: Path, base: dict) -> Point:
    return Point(Entry("dynamic", {"strategy": "dynamic", "backend": "sim"}), 20.0, 0, 0, tmp_path / "p")


def test_resume_reuses_a_point_only_when_its_configuration_is_the_planned_one(tmp_path):
    base = {**FAST, "max_new_tokens": 32}
    point = _point(tmp_path, base)
    _sim(point.folder, **point.config(base).as_settings() | {"out": str(point.folder)})
    summary = json.loads((point.folder / "summary.json").read_text())
    assert stale_point(point, base) == ["simulated true → (unset)"]  # a simulation is no live measurement
    del summary["settings"]["simulated"]  # as the live run of the same point records it
    (point.folder / "summary.json").write_text(json.dumps(summary))
    assert stale_point(point, base) == []
    changed = stale_point(point, {**base, "duration_s": 2.0, "max_new_tokens": 16})
    assert changed == ["duration_s 1 → 2", "max_new_tokens 32 → 16"]
    (point.folder / "summary.json").unlink()
    assert stale_point(point, base) == ["no readable record of its configuration"]


def test_loose_runs_that_differ_are_separate_curves_and_an_interrupted_one_is_not_data(tmp_path):
    _sim(tmp_path / "a", strategy="dynamic", preset="a100-llama2-7b", seed=1)
    _sim(tmp_path / "b", strategy="dynamic", preset="3090-mistral-7b", seed=2)
    _sim(tmp_path / "c", strategy="dynamic", preset="a100-llama2-7b", seed=3)
    _sim(tmp_path / "d", strategy="dynamic", preset="a100-llama2-7b", seed=4)
    RunRecord(tmp_path / "d", RunConfig(**FAST))  # its run.json still says running: the launcher died
    coll = load_collection(tmp_path)
    labels = sorted({r.label for r in coll.runs})
    assert labels == ["dynamic (preset=3090-mistral-7b)", "dynamic (preset=a100-llama2-7b)"]
    assert len(coll.group("dynamic (preset=a100-llama2-7b)", 20.0)) == 2  # a and c: repeats, seeds apart
    assert [f.reason.split(":")[0] for f in coll.failed] == ["incomplete"]


def test_a_sweep_whose_points_differ_within_a_label_is_refused_naming_the_keys(tmp_path):
    for k, preset in enumerate(["a100-llama2-7b", "3090-mistral-7b"]):
        _sim(tmp_path / point_dir("dynamic", 20, k), strategy="dynamic", preset=preset, seed=k)
    points = [{"label": "dynamic", "rate": 20.0, "repeat": k, "dir": str(point_dir("dynamic", 20, k)), "status": "done"}
              for k in range(2)]
    (tmp_path / "sweep.json").write_text(json.dumps({"points": points, "entries": [{"label": "dynamic"}]}))
    with pytest.raises(ReportError, match=r"preset 'a100-llama2-7b' → '3090-mistral-7b'"):
        load_collection(tmp_path)
