"""The settings above one run are declared once, in protocol, as a run's are: the capacity search's and
calibrate's options are generated from their groups with the run's spellings (`--duration`; the former
`--duration-s` still taken, hidden and warned about), calibrate shares the run's model, device and dtype, a
sweep's grid keys carry their help, and the backends' own settings records repeat no default."""
import re
import time
from pathlib import Path
from dataclasses import fields

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from batchlab.api import CapacityResult
from batchlab.cli.main import app
from batchlab.protocol.settings import RunConfig, option_name
from batchlab.protocol.study_settings import AutoRates, AutoRepeats, CalibrateSettings, CapacitySettings, Grid
from tests.test_capacity import fixed_service_config

COMMANDS = get_command(app).commands
WIDE = {"COLUMNS": "200", "TERMINAL_WIDTH": "200"}


def flags(command: str) -> dict[str, list[str]]:
    """The command's visible options: parameter name → its flags."""
    return {p.name: p.opts for p in COMMANDS[command].params if not getattr(p, "hidden", False)}


def test_capacity_has_one_option_per_search_knob_spelled_as_declared():
    given = flags("capacity")
    for name in CapacitySettings.model_fields:
        assert given[name][0] == option_name(name, CapacitySettings), name
    assert given["search_duration_s"][0] == flags("run")["duration_s"][0] == "--duration"


@pytest.fixture
def searched(monkeypatch):
    """The search options `batchlab capacity` hands on (the search itself not run)."""
    seen = {}

    def fake(config, out, *, strategies=None, simulated=False, preset=None, on_progress=None, **given):
        seen.update(given, preset=preset)
        return CapacityResult.of({"strategies": {}}, None)

    monkeypatch.setattr("batchlab.api.capacity", fake)
    return seen


@pytest.mark.parametrize("args, duration_s, warned", [(["--duration", "6"], 6.0, False),
                                                      (["--duration-s", "6"], 6.0, True),
                                                      (["--duration", "7", "--duration-s", "6"], 7.0, True)])
def test_capacity_takes_duration_and_still_the_former_duration_s(tmp_path, searched, args, duration_s, warned):
    result = CliRunner().invoke(app, ["capacity", "c.yaml", "--simulate", "--width", "0.1", *args])
    assert result.exit_code == 0, result.output
    assert searched["search_duration_s"] == duration_s and searched["width"] == 0.1
    assert ("--duration-s is deprecated; use --duration" in result.output) == warned


def test_the_former_spelling_is_hidden_from_help():
    text = CliRunner().invoke(app, ["capacity", "--help"], env=WIDE).output
    assert "--duration " in text and "--duration-s" not in text and "─ Capacity search ─" in text


def test_a_bad_search_knob_is_one_line_naming_it(tmp_path):
    config = fixed_service_config(tmp_path, duration_s=1)
    result = CliRunner().invoke(app, ["capacity", config, "--simulate", "--max-probes", "0"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --max-probes must be > 0, got 0"


@pytest.mark.parametrize("args, line", [
    (["--search-requests", "1000000000000"],
     "error: --search-requests must be ≤ 1000000 requests, got 1000000000000"),
    (["--duration", "1e12"], "error: --duration must be ≤ 86400 s, got 1000000000000.0"),
    (["--saturated-s", "inf"], "error: --saturated-s must be a finite number, got inf"),
])
@pytest.mark.parametrize("mode", [["--simulate"], []], ids=["simulated", "live"])
def test_a_search_too_large_to_plan_is_refused_up_front_naming_its_option(tmp_path, args, line, mode):
    """Before: a 10**12-request probe asked for 7 TiB (a MemoryError after the saturated runs, 87 s into the
    live search), and --saturated-s inf's error named --duration."""
    config = fixed_service_config(tmp_path, duration_s=1)
    started = time.monotonic()
    result = CliRunner().invoke(app, ["capacity", config, *mode, "--out", str(tmp_path / "cap"), *args])
    assert result.exit_code == 1 and result.output.strip() == line
    assert not (tmp_path / "cap").exists() and time.monotonic() - started < 60  # nothing ran


@pytest.mark.parametrize("name", ["model", "device", "dtype"])
def test_calibrate_shares_the_runs_spelling_help_and_default(name):
    ours, runs = (next(p for p in COMMANDS[c].params if p.name == name) for c in ("calibrate", "run"))
    assert ours.opts == runs.opts and ours.help == runs.help
    assert CalibrateSettings.model_fields[name].default == RunConfig.model_fields[name].default


def test_calibrate_refuses_a_backend_it_cannot_measure_in_one_line():
    result = CliRunner().invoke(app, ["calibrate", "--backend", "sim"])
    assert result.exit_code == 1
    assert result.output.strip() == "error: --backend must be one of hf, vllm, got 'sim'"


@pytest.mark.parametrize("group", [Grid, AutoRates, AutoRepeats, CapacitySettings, CalibrateSettings])
def test_every_study_setting_says_what_it_is(group):
    assert not [n for n, f in group.model_fields.items() if not f.description]


@pytest.mark.parametrize("base, grid, entry, limits_s", [
    ("{}", "", "naive", [RunConfig().startup_limit_s]),
    ("{startup_limit_s: 300}", "", "naive", [300]),
    ("{startup_limit_s: 300}", "startup_timeout_s: 120, ", "naive", [120]),  # the former grid key still works
    ("{}", "", "naive, {strategy: dynamic, startup_limit_s: 50}", [RunConfig().startup_limit_s, 50])])
def test_a_sweep_points_startup_limit_is_the_runs_own_setting(tmp_path, base, grid, entry, limits_s):
    from batchlab.runner.launcher import _limits
    from batchlab.lab.sweep_plan import load_plan
    from batchlab.lab.sweep_order import plan_points

    config = tmp_path / "s.yaml"
    config.write_text(f"base: {base}\ngrid: {{{grid}strategies: [{entry}], rates: [1], point_timeout_s: 9}}\n")
    plan = load_plan(config)
    points = plan_points(plan, plan.rates, tmp_path)
    limits = [_limits(plan.limits(), p.config(plan.base)) for p in points]
    assert [lim.startup_s for lim in limits] == limits_s and {lim.run_s for lim in limits} == {9}


def test_the_backends_settings_records_default_as_the_groups_do():
    from batchlab.worker.hf.static import HFSettings
    from batchlab.worker.vllm_engine import VLLMSettings

    run = RunConfig()
    for record in (HFSettings(), VLLMSettings(model=run.model)):
        # max_num_seqs: the group's 0 means the row cap, which the record holds
        shared = [f.name for f in fields(record) if f.name in RunConfig.model_fields and f.name != "max_num_seqs"]
        assert len(shared) >= 5
        assert {n: getattr(record, n) for n in shared} == {n: getattr(run, n) for n in shared}
    assert VLLMSettings(model="m").max_num_seqs == HFSettings().max_batch_size == run.max_batch_size


SMOKE = str(Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml")


@pytest.mark.parametrize("change, outcome", [
    ({"grid.rates.auto.twin": False, "grid.rates.auto.saturated_duration_s": 3}, {"twin": False,
                                                                                  "saturated_duration_s": 3.0}),
    ({"grid.rates.auto.twinn": False}, "unknown grid.rates.auto key twinn (did you mean twin?)"),
    ({"grid.rates.auto.points": 1}, "grid.rates.auto.points: input should be greater than or equal to 2, got 1"),
    ({"grid.rates": [1, 2], "grid.rates.auto.twin": False},
     "grid.rates.auto.twin: the plan's rates are not automatic (grid.rates: auto)"),
])
def test_one_setting_of_the_automatic_rates_is_changed_alike_by_the_yamls_set_and_the_apis_changes(change, outcome):
    """`batchlab sweep --set grid.rates.auto.twin=false` (docs/capacity.md) and api.sweep(changes=...) lay one
    search setting over the plan's others (the YAML's points and saturated repeats stay), and refuse the same bad
    key or value in the same words."""
    from batchlab.lab.sweep_plan import SweepError, load_plan, plan_from

    for read in (lambda: load_plan(SMOKE, change), lambda: plan_from(SMOKE, change)[0]):
        if isinstance(outcome, str):
            with pytest.raises(SweepError, match=re.escape(outcome)):
                read()
            continue
        auto = read().auto
        assert {k: getattr(auto, k) for k in outcome} == outcome
        assert (auto.points, auto.saturated_min_repeats, auto.confirm_max_s) == (16, 2, 4.0)  # the YAML's own
    if isinstance(outcome, str):
        items = [f"--set={k}={'[1, 2]' if isinstance(v, list) else v}" for k, v in change.items()]
        result = CliRunner().invoke(app, ["sweep", SMOKE, "--out", "/nonexistent/never", *items])
        assert result.exit_code != 0 and outcome in result.output and "Traceback" not in result.output
