"""batchlab.api: each function on the sim backend with tiny settings, progress through a callback, one
error hierarchy, no signal handler or prctl set by importing it (a sweep from a notebook, and its resume:
tests/test_notebook.py)."""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from batchlab import api
from batchlab.collector.layout import DONE_FILE

ROOT = Path(__file__).resolve().parent.parent
SIM = {"backend": "sim", "preset": "cpu-tiny-mistral", "dataset": "synthetic", "max_new_tokens": 16,
       "max_prompt_len": 128, "batch_size": 4, "max_batch_size": 8, "max_wait_ms": 50, "warmup_requests": 0}
PLAN = {"base": {**SIM, "duration_s": 2}, "grid": {"strategies": ["naive", "dynamic"], "rates": [4, 8], "seed": 0}}
# the handlers compared with those the process had before the import: a CI job started in the background
# inherits SIGINT ignored, and that must stay so too
IMPORT_CHECK = """
import ctypes, signal, sys
before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
import batchlab.api, batchlab.runner.launcher, batchlab.lab.sweep_point  # what the API's functions import
libc = ctypes.CDLL(None, use_errno=True)
death = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(death), 0, 0, 0)  # PR_GET_PDEATHSIG
print(signal.getsignal(signal.SIGINT) is before[0], signal.getsignal(signal.SIGTERM) is before[1], death.value)
"""


def test_importing_the_api_and_the_cli_changes_no_signal_handler_and_sets_no_parent_death_signal():
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "0"]


def test_importing_the_api_imports_no_command_and_no_heavy_library():
    code = "import sys, batchlab.api; print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', " \
           "'pandas', 'torch', 'zmq') or m.startswith('batchlab.cli')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("name, builtin", [("ConfigError", ValueError), ("SweepError", ValueError),
                                           ("RunFailed", RuntimeError), ("RunTimeout", RuntimeError),
                                           ("ReportError", ValueError), ("SummaryError", ValueError),
                                           ("DatasetError", Exception), ("BackendError", Exception)])
def test_every_error_is_a_batchlab_error_and_keeps_its_builtin_base(name, builtin):
    error = getattr(api, name)
    assert issubclass(error, api.BatchlabError) and issubclass(error, builtin)


def test_a_bad_setting_is_a_config_error_before_any_folder_or_process(tmp_path):
    with pytest.raises(api.ConfigError, match="rate"):
        api.run({**SIM, "rate": -1}, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_typed_settings_with_an_unknown_strategy_are_refused_before_any_folder(tmp_path):
    with pytest.raises(api.ConfigError, match="unknown strategy 'nope'"):
        api.run(api.RunConfig(backend="sim", strategy="nope"), out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_plan_given_as_a_mapping_must_name_its_folder():
    with pytest.raises(api.SweepError, match="out"):
        api.sweep(PLAN)


def test_simulate_writes_every_point_and_reports_each_through_the_callback(tmp_path):
    events: list[api.Event] = []
    result = api.simulate(strategy=["naive", "dynamic"], rate=[4, 8], duration_s=5, out=str(tmp_path / "sim"),
                          on_progress=events.append, **{k: v for k, v in SIM.items() if k != "backend"})
    summaries = result.summaries()
    assert sorted(summaries) == [(lb, r, 0, 0) for lb in ("dynamic", "naive") for r in (4.0, 8.0)]
    assert all(s.finished > 0 for s in summaries.values())
    assert [(e.kind, e.point.entry.label, e.point.rate) for e in events] == \
        [(api.EventKind.FINISHED, r.label, r.rate) for r in result.records]
    # each point's own simulation time, the one its folder records (not the time since the last event)
    recorded = {(r.label, r.rate): json.loads((r.folder / DONE_FILE).read_text())["elapsed_s"]
                for r in result.records}
    assert all(e.record["elapsed_s"] == recorded[e.point.entry.label, e.point.rate] > 0 for e in events)
    assert json.loads((tmp_path / "sim" / "sweep.json").read_text())["simulated"] is True


def test_a_trace_arrival_given_beside_no_rate_keeps_the_traces_own_timing(tmp_path):
    from batchlab.lab.sweep_plan import plan_from

    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_len,output_len\n" + "".join(f"{i * 0.25},16,4\n" for i in range(40)))
    given = {"dataset": f"trace:{trace}", "arrival": "trace"}
    assert plan_from({}, given)[0].rates == [0.0]  # a run's settings, the trace's arrival later
    assert plan_from(given)[0].rates == [0.0]
    assert plan_from({}, {**given, "rate": 2})[0].rates == [2.0]  # a rate asked for is kept
    assert plan_from({"base": given, "grid": {"strategies": ["naive"]}})[0].rates == [0.0]
    assert plan_from({}, {"arrival": "poisson"})[0].rates == [10.0]


def test_a_simulated_capacity_search_brackets_every_strategy_below_its_mu(tmp_path):
    result = api.capacity(PLAN, tmp_path, simulated=True, search_duration_s=5, saturated_duration_s=5, max_probes=4)
    assert result.simulated and set(result.estimates) == {"naive", "dynamic"}
    for label, c in result.strategies.items():
        assert 0 < result.estimates[label] <= c.saturated_req_s * 1.000001
    recorded = json.loads((tmp_path / "capacity.json").read_text())["strategies"]
    assert recorded.keys() == {"naive", "dynamic"}
    assert any("naive" in line for line in result.lines())
    points = result.points()  # each probe's nominal rate beside what its arrivals offered, as capacity.json has it
    offered = [p["offered_req_s"] for c in recorded.values() for p in c["probes"]]
    assert points["offered_req_s"].tolist() == offered and points["rate_req_s"].tolist() != offered


def test_tune_ranks_the_grid_it_was_given_by_goodput(tmp_path):
    settings = {**SIM, "strategy": "dynamic", "rate": 6, "duration_s": 5, "slo": ["ttft=1s"]}
    result = api.tune(settings, tmp_path, knobs={"max_batch_size": [2, 8], "max_wait_ms": [10]})
    knobs = [c.knobs for c in result.candidates]
    assert sorted(k["max_batch_size"] for k in knobs) == [2, 8] and all(k["max_wait_ms"] == 10 for k in knobs)
    goodputs = [c.goodput for c in result.candidates]
    assert goodputs == sorted(goodputs, reverse=True) and result.best == result.candidates[0]
    assert json.loads((tmp_path / "tune.json").read_text())["candidates"] == result.record["candidates"]
    assert list(result.points()["max_batch_size"]) == [c.knobs["max_batch_size"] for c in result.candidates]


def test_tune_without_an_slo_is_a_config_error(tmp_path):
    with pytest.raises(api.ConfigError, match="SLO"):
        api.tune({**SIM, "strategy": "dynamic"}, out=tmp_path)


def test_the_terminal_sweep_view_is_a_progress_callback(capsys):
    from batchlab.lab.sweep_plan import Entry, Point
    from batchlab.cli.live import SweepView

    point = Point(Entry("dynamic", {"strategy": "dynamic"}), 5.0, 0, 0, Path("nowhere"))
    with SweepView() as view:  # not a terminal here: plain lines on stderr
        view(api.Event("start", total=1))
        view(api.Event("note", text="capacity searched"))
        view(api.Event("tick", point=point, phase="run", elapsed_s=1.0, alive={"collector": True}))
        view(api.Event("finished", point=point, record={"status": "done", "elapsed_s": 2.5, "reason": ""}))
    assert capsys.readouterr().err.splitlines() == ["capacity searched", "dynamic λ=5 rep 0: done in 2.5s"]
    assert view.counts["done"] == 1


def test_the_ready_callbacks_show_notes_and_finished_points_but_not_ticks(capsys, caplog):
    from batchlab.lab.sweep_plan import Entry, Point

    point = Point(Entry("naive", {"strategy": "naive"}), 4.0, 1, 0, Path("nowhere"))
    view = api.progress.CallbackView(api.print_progress)
    view.start(2)
    view.ticker(point, "run")(0.5, {"collector": True})
    view.note("capacity searched")
    view.finished(point, {"status": "failed", "elapsed_s": 1.0, "reason": "RunFailed: worker-0 died\nmore"})
    assert capsys.readouterr().err.splitlines() == ["2 points to run", "capacity searched",
                                                    "naive λ=4 rep 1: failed in 1.0s: RunFailed: worker-0 died"]
    with caplog.at_level("INFO", logger="batchlab"):
        api.log_progress(api.Event("note", text="a line"))
        api.log_progress(api.Event("tick", elapsed_s=1.0))
    assert [r.getMessage() for r in caplog.records] == ["a line"]


def test_the_sweep_command_calls_the_api_with_its_terminal_view(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app
    from batchlab.cli.live import SweepView

    calls = []
    monkeypatch.setattr("batchlab.api.sweep", lambda plan, out, **kw: calls.append((plan, out, kw)) or
                        api.SweepResult(Path(out), []))
    result = CliRunner().invoke(app, ["sweep", "plan.yaml", "--out", str(tmp_path), "--set", "grid.repeats=2"])
    assert result.exit_code == 1 and "0 of 0 points" in result.output  # nothing measured: exit 1
    [(plan, out, kw)] = calls
    assert (plan, out, kw["grid.repeats"]) == ("plan.yaml", str(tmp_path), 2)
    assert isinstance(kw["on_progress"], SweepView) and kw["ray"] is None

    # the --ray-* options are protocol.study_settings.RaySettings' fields, checked before anything runs
    CliRunner().invoke(app, ["sweep", "plan.yaml", "--out", str(tmp_path), "--ray", "--ray-cpus", "2",
                             "--ray-shared"])
    assert calls[-1][2]["ray"] == api.RaySettings(address="local", cpus=2.0, shared=True)
    result = CliRunner().invoke(app, ["sweep", "plan.yaml", "--out", str(tmp_path), "--ray", "--ray-cpus", "-1"])
    assert result.exit_code == 1 and len(calls) == 2
    assert result.output.strip().splitlines() == ["error: --ray-cpus must be ≥ 0, got -1.0"]


def test_a_sweep_on_ray_takes_the_parsed_plan_and_refuses_before_anything_starts(monkeypatch, tmp_path):
    class NoNodes:  # a cluster none of whose nodes can hold a group
        def nodes(self):
            return []

    monkeypatch.setattr("batchlab.lab.ray_sweep.connect", lambda address: NoNodes())
    with pytest.raises(api.SweepError, match="refused before anything started"):
        api.sweep(PLAN, tmp_path / "ray", ray="local")  # an address alone; RaySettings' defaults for the rest
    with pytest.raises(api.ConfigError, match="cpu"):  # a mapping of the settings, checked as the command checks
        api.sweep(PLAN, tmp_path / "ray", ray={"address": "local", "cpu": 2})
    assert not (tmp_path / "ray").exists()


@pytest.mark.slow
def test_a_run_returns_its_summary_ticks_through_the_callback_and_leaves_sigint_alone(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    config = tmp_path / "run.yaml"
    run_settings = {k: v for k, v in SIM.items() if k != "warmup_requests"}  # a vllm setting: sim refuses it
    config.write_text(yaml.safe_dump({**run_settings, "strategy": "dynamic", "rate": 8, "duration_s": 1}))
    events: list[api.Event] = []
    summary = api.run(config, out=tmp_path / "run", on_progress=events.append)
    assert summary.finished > 0 and summary.failed == 0 and summary.role_deaths == []
    start, *ticks = events  # the start names the run's folder before any process starts
    assert (start.kind, start.total, start.folder) == (api.EventKind.START, 1, tmp_path / "run")
    assert ticks and {e.kind for e in ticks} == {"tick"} and {e.folder for e in ticks} == {tmp_path / "run"}
    assert "collector" in ticks[-1].alive
    assert len(summary.requests()) == summary.scheduled and set(summary.batches()["label"]) == {"dynamic"}
    assert summary.points()["finished"].tolist() == [summary.finished]
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(api.ConfigError, match="already holds a run"):  # a used folder, refused without overwrite
        api.run(config, out=tmp_path / "run")
