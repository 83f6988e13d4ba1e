"""Closed-loop load (--concurrency): the clients' pure logic, its settings, and the schedule it records."""
import math

import pytest
import yaml

from batchlab.runner.preflight import checked_config
from batchlab.cli.result_table import table, warnings
from tests.summaries import make_summary
from batchlab.protocol.identity import config_hash
from batchlab.protocol.settings import ConfigError
from batchlab.simulator.run import simulate
from batchlab.traffic.closed_loop import ClientPool
from batchlab.traffic.run_schedule import CLOSED_LOOP_POOL_REQUESTS, make_schedule, traffic_config
from batchlab.traffic.schedule import content_hash, with_send_times

SYNTHETIC = {"dataset": "synthetic", "prompt_lengths": 16, "output_lengths": 8}


def _drive(pool: ClientPool, service_s: float, until_s: float) -> list[tuple[float, int]]:
    """Every request takes service_s; returns (time, outstanding) after each event, in time order."""
    t, ends, seen = 0.0, [], []
    pool.start(0.0)
    while t <= until_s and not pool.done(t):
        for rid, _ in pool.due(t):
            ends.append((t + service_s, rid))
        seen.append((t, len(pool.outstanding)))
        ends.sort()
        wake = pool.next_send_at()
        t = min(ends[0][0] if ends else math.inf, wake if wake is not None and wake > t else math.inf)
        while ends and ends[0][0] <= t:
            pool.on_ended([ends.pop(0)[1]], t)
    return seen


def test_n_clients_never_have_more_than_n_requests_out():
    pool = ClientPool(clients=3, n_requests=20)
    seen = _drive(pool, service_s=0.5, until_s=100)
    assert max(n for _, n in seen) == 3
    assert pool.next_index == 20


def test_each_client_sends_at_t0_then_only_after_an_end():
    pool = ClientPool(clients=2, n_requests=10)
    pool.start(5.0)
    assert pool.due(5.0) == [(0, 5.0), (1, 5.0)]
    assert pool.due(9.0) == [] and pool.next_send_at() is None  # both busy
    pool.on_ended([1], 6.0)
    assert pool.due(6.0) == [(2, 6.0)]


def test_think_time_delays_the_next_send():
    pool = ClientPool(clients=1, n_requests=5, think_s=0.25)
    pool.start(0.0)
    pool.due(0.0)
    pool.on_ended([0], 1.0)
    assert pool.due(1.2) == [] and pool.next_send_at() == 1.25
    assert pool.due(1.25) == [(1, 1.25)]


def test_an_end_counts_once_and_unknown_ids_are_ignored():
    pool = ClientPool(clients=1, n_requests=5)
    pool.start(0.0)
    pool.due(0.0)
    assert pool.on_ended([0, 0, 7], 1.0) == [1.0]
    assert len(pool.ready) == 1


def test_the_schedule_running_out_stops_sending():
    pool = ClientPool(clients=4, n_requests=2)
    pool.start(0.0)
    assert [i for i, _ in pool.due(0.0)] == [0, 1]
    assert pool.done(0.0)


def test_the_duration_stops_sending_even_with_requests_left():
    pool = ClientPool(clients=1, n_requests=100, stop_at=2.0)
    seen = _drive(pool, service_s=0.5, until_s=100)
    assert pool.next_index == 4  # sent at 0, 0.5, 1.0, 1.5; none at 2.0
    assert max(t for t, _ in seen) < 2.0 + 1e-9
    assert pool.done(2.0)


def test_a_free_client_past_the_stop_is_done():
    pool = ClientPool(clients=1, n_requests=100, think_s=5.0, stop_at=3.0)
    pool.start(0.0)
    pool.due(0.0)
    assert not pool.done(1.0)  # its request could end and free it before the stop
    pool.on_ended([0], 1.0)  # ready again at 6.0: past the stop
    assert pool.done(1.0)


def test_concurrency_takes_the_seeded_schedule_with_every_request_ready_at_zero():
    cfg = checked_config({**SYNTHETIC, "concurrency": 4}, {"num_requests": 30})
    assert cfg.rate == math.inf and cfg.duration_s > 1000  # the count alone stops it
    schedule = make_schedule(cfg)
    assert schedule.n_requests == 30
    open_loop = make_schedule(checked_config({**SYNTHETIC, "rate": 5.0}, {"num_requests": 30}))
    assert schedule.frame["prompt_tokens"].map(list).tolist() == open_loop.frame["prompt_tokens"].map(list).tolist()


def test_concurrency_with_a_duration_alone_takes_a_pool_of_requests():
    cfg = checked_config({**SYNTHETIC, "concurrency": 2, "duration_s": 3.0}, {})
    assert traffic_config(cfg).num_requests == CLOSED_LOOP_POOL_REQUESTS


@pytest.mark.parametrize("given", [{"rate": 5.0}, {"arrival": "gamma"}, {"rate": 0.5, "arrival": "constant"}])
def test_concurrency_beside_an_open_loop_setting_is_refused(given):
    with pytest.raises(ConfigError, match="concurrency=N .* does not go with rate or arrival"):
        checked_config({"concurrency": 4, "num_requests": 10}, given)


def test_naive_batches_larger_than_the_clients_are_refused():
    with pytest.raises(ConfigError, match="never have that many out"):
        checked_config({"strategy": "naive", "batch_size": 8, "concurrency": 4, "num_requests": 10}, {})
    assert checked_config({"strategy": "naive", "batch_size": 4, "concurrency": 4, "num_requests": 10}, {})


def test_a_closed_loop_config_rebuilt_from_its_settings_is_the_same():
    cfg = checked_config({**SYNTHETIC, "concurrency": 4, "think_time_ms": 20.0}, {"num_requests": 10})
    again = checked_config(cfg.as_settings(), {})
    assert (again.concurrency, again.think_time_ms, again.rate) == (4, 20.0, math.inf)


@pytest.mark.parametrize("given, option", [({"concurrency": -1}, "concurrency"),
                                           ({"concurrency": 2, "think_time_ms": -5.0}, "think_time_ms")])
def test_a_negative_closed_loop_setting_is_refused(given, option):
    with pytest.raises(ConfigError, match=option):
        checked_config({**given, "num_requests": 10}, {})


def test_closed_loop_over_a_saved_schedule_keeps_its_own_load_settings(tmp_path):
    from batchlab.runner.config import replay_config
    from batchlab.traffic.schedule import save_schedule

    path = tmp_path / "schedule.parquet"
    save_schedule(make_schedule(checked_config({**SYNTHETIC, "rate": 5.0}, {"num_requests": 8})), path)
    cfg = replay_config(checked_config({"concurrency": 2, "schedule": str(path)}, {}), {})
    assert (cfg.rate, cfg.concurrency, cfg.num_requests) == (math.inf, 2, 8)


def test_the_recorded_schedule_is_what_was_sent_when_it_was_sent():
    schedule = make_schedule(checked_config({**SYNTHETIC, "concurrency": 2}, {"num_requests": 6}))
    sent = with_send_times(schedule, [0.0, 0.0, 0.4, 0.5])
    assert sent.n_requests == 4 and sent.frame["arrival_offset_s"].tolist() == [0.0, 0.0, 0.4, 0.5]
    tokens = list(sent.frame["prompt_tokens"])
    assert sent.content_hash == content_hash(sent.frame["arrival_offset_s"].to_numpy(), tokens,
                                             sent.frame["output_len"].to_numpy())
    assert sent.content_hash != schedule.content_hash


def _simulated(given: dict):
    cfg = checked_config({**SYNTHETIC, "strategy": "continuous", "preset": "cpu-tiny-mistral", **given}, {})
    tables = simulate(cfg, make_schedule(cfg))
    return tables.requests.sort_values("arrival_time", kind="stable").reset_index(drop=True), tables.summary


def test_simulated_clients_keep_n_requests_out_from_time_zero():
    requests, summary = _simulated({"concurrency": 3, "num_requests": 24})
    assert len(requests) == 24 and (requests["status"] == "finished").all()
    assert (requests["arrival_time"].iloc[:3] == 0).all() and (requests["arrival_time"].iloc[3:] > 0).all()
    ends = sorted([(t, -1) for t in requests["completion_time"]] + [(t, 1) for t in requests["arrival_time"]])
    level = [sum(step for _, step in ends[:i + 1]) for i in range(len(ends))]
    assert max(level) == 3
    assert summary.settings["concurrency"] == 3


def test_a_simulated_client_sends_its_think_time_after_its_last_end():
    requests, _ = _simulated({"concurrency": 1, "think_time_ms": 100.0, "num_requests": 6})
    gaps = requests["arrival_time"].iloc[1:].to_numpy() - requests["completion_time"].iloc[:-1].to_numpy()
    assert gaps == pytest.approx([0.1] * 5)


def test_a_simulated_closed_loop_stops_at_its_duration():
    requests, _ = _simulated({"concurrency": 1, "duration_s": 0.5})
    assert 0 < len(requests) < CLOSED_LOOP_POOL_REQUESTS
    assert requests["arrival_time"].max() < 0.5


@pytest.mark.slow
def test_a_simulated_concurrency_sweep_reports_against_clients(tmp_path):
    from typer.testing import CliRunner

    from batchlab.cli.main import app

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {**SYNTHETIC, "num_requests": 12, "preset": "cpu-tiny-mistral"},
                                    "grid": {"strategies": ["continuous"], "concurrency": [1, 4]}}))
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    folders = sorted(p.name for p in (tmp_path / "out" / "sweep_label=continuous").iterdir())
    assert folders == ["sweep_concurrency=1", "sweep_concurrency=4"]
    report = runner.invoke(app, ["report", str(tmp_path / "out")])
    assert report.exit_code == 0, report.output
    assert "capacity (estimate" not in report.output  # no empty capacity table: closed loop has no offered rate
    text = (tmp_path / "out" / "REPORT.md").read_text()
    assert "coordinated omission" in text and "### 1 clients" in text and "### 4 clients" in text
    assert "## Capacity" in text and "capacity req/s" not in text
    assert (tmp_path / "out" / "latency_vs_concurrency.png").is_file()


def test_the_result_table_shows_the_clients_instead_of_an_offered_rate():
    summary = make_summary(settings={"concurrency": 8, "think_time_ms": 50.0, "rate": "inf"}, finished=3, scheduled=3,
                           harness_lag={"p99": 0.5})
    rows = table(summary).columns[0]._cells
    assert "closed loop (clients)" in rows and "offered rate (req/s)" not in rows
    assert "8, think 50 ms" in table(summary).columns[1]._cells
    assert not any("lagged" in w for w in warnings(summary))  # no planned times to lag behind


def _sweep(tmp_path, grid: dict, base: dict | None = None):
    from batchlab.lab.sweep_plan import load_plan

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": {"backend": "sim", "num_requests": 20, **(base or {})},
                                    "grid": {"strategies": ["continuous"], **grid}}))
    return load_plan(path)


def test_a_concurrency_grid_plans_one_closed_loop_point_per_client_count(tmp_path):
    from batchlab.lab.sweep_order import plan_points

    plan = _sweep(tmp_path, {"concurrency": [4, 1, 2, 8, 2]})
    points = plan_points(plan, plan.rates, tmp_path / "out")
    configs = [p.config(plan.base) for p in points]
    assert [c.concurrency for c in configs] == [1, 2, 4, 8]
    assert all(c.rate == math.inf for c in configs)
    assert [p.folder.parent.name for p in points] == [f"sweep_concurrency={n}" for n in (1, 2, 4, 8)]
    hashes = {config_hash(c.as_settings()) for c in configs}
    assert len(hashes) == 4  # a resumed point over a changed concurrency is another point
    think = _sweep(tmp_path, {"concurrency": [4]}, {"think_time_ms": 100})
    assert config_hash(plan_points(think, [], tmp_path / "out")[0].config(think.base).as_settings()) not in hashes
    assert points[0].record("pending")["concurrency"] == 1


@pytest.mark.parametrize("grid, base", [({"concurrency": [2], "rates": [5]}, {}), ({"concurrency": [2]}, {"rate": 5}),
                                        ({"concurrency": [0]}, {}), ({"concurrency": 4}, {})])
def test_a_concurrency_grid_beside_rates_or_with_a_bad_count_is_refused(tmp_path, grid, base):
    from batchlab.lab.sweep_plan import SweepError

    with pytest.raises((SweepError, ConfigError), match="concurrency"):
        _sweep(tmp_path, grid, base)
