"""The trace and length settings as a user gives them (YAML, options) reach the traffic layer."""
import pytest

from batchlab.runner.preflight import checked_config
from batchlab.protocol.settings import ConfigError
from batchlab.traffic.run_schedule import make_schedule, traffic_config


def test_yaml_lengths_as_int_list_or_text_become_one_text_form_and_reach_the_schedule():
    cfg = checked_config({"dataset": "synthetic", "prompt_lengths": 128, "output_lengths": [16, 32],
                          "rate": 20.0, "duration_s": 2.0}, {})
    assert (cfg.prompt_lengths, cfg.output_lengths) == ("128", "16,32")
    frame = make_schedule(cfg).frame
    assert set(frame.prompt_len) == {128} and set(frame.output_len) <= {16, 32}
    assert checked_config({}, {"prompt_lengths": "32-64"}).prompt_lengths == "32-64"


def test_a_length_setting_that_describes_no_lengths_is_one_config_error_naming_it():
    with pytest.raises(ConfigError, match="output_lengths"):
        checked_config({"output_lengths": "lots"}, {})


def test_a_trace_keeps_its_own_timing_unless_a_rate_is_given():
    own = checked_config({"dataset": "azure-code", "arrival": "trace", "trace_start_s": 600.0}, {})
    scaled = checked_config({"dataset": "azure-code", "arrival": "trace"}, {"rate": 2.0})
    assert own.rate == 0.0 and scaled.rate == 2.0
    assert traffic_config(own).trace_start_s == 600.0
    with pytest.raises(ConfigError, match="rate must be > 0"):
        checked_config({"arrival": "poisson", "rate": 0.0}, {})
