"""A strategy given from Python as the class itself: named module:Class when that name imports it back, carried
by value when no other process can import it (a notebook's class: tests/test_notebook.py runs one live from a
Jupyter kernel), built with its own Params defaults unless the run's settings give a same-named setting
explicitly; batchlab.api.strategy holds what its author needs."""
import dataclasses
import time

import pytest

from batchlab import api
from batchlab.api.strategy import Decision, Policy, check
from batchlab.protocol.plugins import class_digest
from batchlab.runner.preflight import checked_config
from batchlab.scheduler.strategies import check_decides, resolve

SIM = {"backend": "sim", "dataset": "synthetic", "max_new_tokens": 16,  # the default preset: steps of ms
       "max_prompt_len": 128}


@dataclasses.dataclass
class GreedyParams:
    max_batch_size: int = 8  # the plugin's own cap: the run's default (16) must not replace it
    max_wait_ms: float = 50.0


class Greedy(Policy):
    """Launch as many queued requests as the worker has room for, up to its own cap."""

    mode = "static"
    Params = GreedyParams

    def decide(self, queue, now, cap, end_of_stream):
        n = min(len(queue), cap.free_slots, self.params.max_batch_size)
        return Decision(n, "greedy") if n else Decision()


def test_a_plugins_own_parameter_defaults_hold_unless_the_run_gives_that_setting():
    unset = checked_config({"strategy": Greedy}, {})
    assert unset.max_batch_size == 16 and "max_batch_size" not in unset.model_fields_set
    assert resolve(unset).rows == 8 and resolve(unset).policy().params.max_batch_size == 8
    assert unset.strategy_args == {"max_batch_size": 8}  # recorded: the run's record says what ran
    given = checked_config({"strategy": Greedy, "max_batch_size": 12}, {})
    assert resolve(given).rows == 12 and given.strategy_args == {}
    argued = checked_config({"strategy": Greedy, "strategy_args": {"max_batch_size": 4}}, {})
    assert resolve(argued).rows == 4 and argued.strategy_args == {"max_batch_size": 4}
    # replayed from what the run recorded (every setting given then), it runs the same
    replay = checked_config({**unset.as_settings(), "out": "."}, {})
    replay._strategy_code = unset.strategy_code()
    assert resolve(replay).rows == 8


def test_the_built_in_strategies_record_no_parameter_of_their_own():
    for name in ("naive", "dynamic", "continuous", "sjf", "edf"):
        cfg = checked_config({"strategy": name, "slo": ["ttft=1s"]}, {})
        assert cfg.strategy_args == {}, name


def test_a_local_class_travels_by_value_and_an_importable_one_by_its_name(monkeypatch):
    cfg = api.RunConfig(strategy=Greedy)
    assert (cfg.strategy, cfg.label) == (f"{__name__}:Greedy", "greedy")
    assert cfg.strategy_sha256 == "" and cfg.strategy_code() == b""  # this test module imports by name
    local = type("Local", (Greedy,), {})  # as a notebook's class: no module imports it
    cfg = api.RunConfig(strategy=local)
    assert cfg.strategy_sha256.startswith("sha256:") and cfg.strategy_code()
    assert resolve(cfg).policy().name == "local"
    cfg.strategy_args = {"max_wait_ms": 10}  # an edit keeps the code; a copy made from its text alone has none
    assert cfg.model_copy().strategy_code() == cfg.strategy_code()
    with pytest.raises(api.ConfigError, match="pass the class itself again"):
        resolve(api.RunConfig(**cfg.model_dump()))


def test_the_digest_names_what_the_class_does_not_the_session():
    def made(cap: int) -> type:
        params = dataclasses.make_dataclass("Params", [("max_batch_size", int, cap)])
        return type("Fifo", (Greedy,), {"Params": params})

    assert class_digest(made(8)) == class_digest(made(8)) != class_digest(made(4))


def test_check_names_what_a_strategy_class_lacks():
    assert check(Greedy) is Greedy
    with pytest.raises(api.ConfigError, match="lacks decide"):
        check(type("NoDecide", (), {"name": "x", "mode": "static", "on_batch_done": lambda *a: None}))
    with pytest.raises(api.ConfigError, match="mode must be one of"):
        check(type("Odd", (Greedy,), {"mode": "sometimes"}))


def test_a_class_is_simulated_with_its_own_cap(tmp_path):
    result = api.simulate(strategy=Greedy, rate=float("inf"), num_requests=40, out=str(tmp_path / "sim"), **SIM)
    [summary] = result.summaries().values()
    sizes = result.batches()["size"]
    assert summary.finished > 0 and sizes.max() == 8 and set(result.batches()["label"]) == {"greedy"}


class NoDecide(Policy):
    """A strategy its author forgot to finish: Policy's decide raises NotImplementedError."""

    mode = "static"


class FirstInLine(Policy):
    """Reads queue[0] without looking: IndexError on an empty queue, the scheduler's first event."""

    mode = "static"

    def decide(self, queue, now, cap, end_of_stream):
        return Decision(1, "first") if queue[0] else Decision()


@pytest.mark.parametrize(("cls", "error"), [(NoDecide, "NotImplementedError: NoDecide.decide"),
                                            (FirstInLine, "IndexError")])
def test_a_strategy_whose_decide_raises_is_refused_before_a_process_starts(tmp_path, cls, error):
    started = time.monotonic()
    with pytest.raises(api.ConfigError, match=rf"{cls.__name__}\): decide on an empty queue raised {error}"):
        api.run({**SIM, "strategy": cls}, out=tmp_path / "run")
    assert time.monotonic() - started < 2.0  # not a run that crashes ~30 s later
    assert not (tmp_path / "run").exists()
    with pytest.raises(api.ConfigError, match="decide on an empty queue"):
        check(cls)


def test_the_built_in_strategies_decide_on_an_empty_queue():
    for name in ("naive", "dynamic", "continuous", "sjf", "edf"):
        check_decides(resolve(checked_config({**SIM, "strategy": name, "slo": ["ttft=500ms"]}, {})))
