"""The API's inputs checked at its edge: anything but settings, a mapping or a path is a ConfigError, and every
error a user's input causes is a BatchlabError naming what is wrong, before any folder or process exists."""
import math

import pytest

from batchlab import api

SIM = {"backend": "sim", "dataset": "synthetic", "duration_s": 1}
PLAN = {"base": SIM, "grid": {"strategies": ["naive", "dynamic"], "rates": [4]}}


@pytest.mark.parametrize("job, given", [(api.run, None), (api.run, 12345), (api.run, [("rate", 5)]),
                                        (api.run, ["backend", "sim"]), (api.tune, 3.5), (api.sweep, 42),
                                        (api.sweep, None), (api.capacity, b"plan"), (api.simulate, 42)])
def test_anything_but_settings_a_mapping_or_a_path_is_a_config_error(job, given, tmp_path):
    with pytest.raises(api.ConfigError, match="not "):
        job(given, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("job", [api.run, api.tune, api.sweep, api.simulate, api.calibrate])
def test_a_data_frame_given_as_settings_is_named_by_its_type_on_one_line(job, tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"rate": [4, 8], "strategy": ["naive", "dynamic"]})
    with pytest.raises(api.ConfigError) as refused:
        job(frame, tmp_path / "out")
    message = str(refused.value)
    assert "\n" not in message and message.endswith("not DataFrame") and "naive" not in message
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_the_yaml_is_a_config_error(tmp_path):
    for job in (api.run, api.sweep, api.simulate):
        with pytest.raises(api.ConfigError, match="is a folder, not a YAML file"):
            job(tmp_path, tmp_path / "out")


def test_an_out_folder_that_cannot_be_made_is_a_config_error_naming_out(tmp_path):
    with pytest.raises(api.ConfigError, match=r"^out /proc/self/x/y: cannot make the folder"):
        api.run(SIM, "/proc/self/x/y")
    with pytest.raises(api.ConfigError, match="^out "):
        api.sweep(PLAN, "/proc/self/x/y")
    (tmp_path / "file").write_text("")
    with pytest.raises(api.ConfigError, match="is a file, not a folder"):
        api.simulate(SIM, tmp_path / "file")


def test_a_schedule_too_large_to_hold_is_a_config_error_not_a_memory_error(tmp_path):
    with pytest.raises(api.ConfigError, match=r"plans 1e\+18 requests, over the 100,000,000"):
        api.run({**SIM, "rate": 1e6, "duration_s": 1e12}, tmp_path / "out")
    with pytest.raises(api.ConfigError, match="over the 100,000,000"):
        api.run({**SIM, "rate": math.inf, "num_requests": 10**12}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_change_that_is_no_setting_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(api.ConfigError, match="unknown setting.*sets"):  # the former spelling of the changes
        api.sweep(PLAN, tmp_path / "out", sets=["duration_s=2"])
    with pytest.raises(api.ConfigError, match="unknown setting.*rat .*did you mean rate"):
        api.run(SIM, tmp_path / "run", rat=5)
    with pytest.raises(api.SweepError, match="grid.repeats"):
        api.simulate(PLAN, tmp_path / "sim", repeats=0)


def test_report_options_that_are_none_are_config_errors(tmp_path):
    result = api.simulate(SIM, tmp_path / "run")
    for slos, what in (({"nosuch": 1}, "no SLO named 'nosuch'"), ({"ttft": -1}, "ttft must be a number"),
                       (["ttft=abc"], "is not a number|expected NAME=VALUE"), (42, "are a mapping")):
        with pytest.raises(api.ConfigError, match=what):
            api.report(result.out, slos=slos)
    with pytest.raises(api.ConfigError, match="rate must be"):
        api.report(result.out, rate="fast")
    with pytest.raises(api.ConfigError, match="a path"):
        api.report(12)
    assert not (result.out / "REPORT.md").exists()


def test_a_bad_preset_is_a_config_error_live_and_simulated(tmp_path):
    with pytest.raises(api.ConfigError, match="unknown sim preset 'nope'"):
        api.capacity(PLAN, simulated=True, preset="nope")
    with pytest.raises(api.ConfigError, match="unknown sim preset"):
        api.simulate(PLAN, tmp_path / "sim", preset="nope")
    with pytest.raises(api.ConfigError, match="unknown sim preset"):
        api.run({**SIM, "preset": "nope"}, tmp_path / "run")


def test_tune_and_calibrate_check_their_own_arguments(tmp_path):
    settings = {**SIM, "slo": ["ttft=1s"]}
    for knobs in (42, [1, 2], "max_batch_size=2"):
        with pytest.raises(api.ConfigError, match="knobs are"):
            api.tune(settings, tmp_path / "tune", knobs=knobs)
    with pytest.raises(api.ConfigError, match="confirm must be"):
        api.tune(settings, tmp_path / "tune", confirm=-1)
    with pytest.raises(api.ConfigError, match="weigh must be one of"):
        api.calibrate(runs=[tmp_path], weigh="tokens")
    with pytest.raises(api.ConfigError, match="runs: a run or sweep folder"):
        api.calibrate(runs=[42])
    with pytest.raises(api.CalibrateError, match="no such folder"):
        api.calibrate(runs=[tmp_path / "none"], out=tmp_path / "p.yaml")
