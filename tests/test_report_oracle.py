"""REPORT.md's "vs oracle" section (sjf with the oracle predictor, found by its settings) and the schedule's
notes in summary.json and the setup section; sweeps are simulated (deterministic), in this process, two
for the module (each test reports into its own copy)."""
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from batchlab.collector.layout import point_dir
from batchlab.report import oracle
from batchlab.report.points import Collection, FailedPoint, RunData
from batchlab.report.stats import GroupStats
from batchlab.stats.metrics import request_metrics
from typer.testing import CliRunner

from batchlab.cli.main import app
from tests.summaries import make_summary

EMPTY = pd.DataFrame()


def run(label: str, rate: float, settings: dict, seed: int = 0) -> RunData:
    summary = make_summary(settings={"seed": seed, **settings})
    return RunData(label, rate, 0, Path("."), summary, EMPTY, EMPTY, EMPTY, EMPTY)


def group(label: str, rate: float, e2e_mean_s: float, e2e_p99_s: float, goodput: float | None = None,
          failed: int = 0) -> GroupStats:
    lat = {m: {"mean": 0.01, "p50": 0.01, "p90": 0.01, "p99": 0.01} for m in ("ttft", "tpot", "itl")}
    lat["e2e"] = {"mean": e2e_mean_s, "p50": e2e_mean_s, "p90": e2e_p99_s, "p99": e2e_p99_s}
    return GroupStats(label, rate, 1, 100.0, 1.0, 100, failed, lat, {}, 0, 1.0, goodput)


SJF = {"strategy": "sjf"}
DYNAMIC = {"strategy": "dynamic"}


@pytest.mark.parametrize("settings, expected", [
    ({"strategy": "sjf"}, True), ({"strategy": "sjf", "strategy_args": {}}, True),
    ({"strategy": "sjf", "strategy_args": {"predictor": "oracle", "noise": 0.1}}, True),
    ({"strategy": "sjf", "strategy_args": {"predictor": "prompt"}}, False),
    ({"strategy": "sjf", "strategy_args": {"predictor": "noisy"}}, False),
    ({"strategy": "dynamic", "strategy_args": {"predictor": "oracle"}}, False), ({}, False)])
def test_the_oracle_is_sjf_whose_predictor_is_oracle_or_missing(settings, expected):
    assert oracle.is_oracle(settings) is expected


def test_the_oracle_is_found_by_settings_not_by_label():
    coll = Collection(Path("."), runs=[run("dynamic", 4.0, DYNAMIC), run("sjf-prompt", 4.0,
                                        {"strategy": "sjf", "strategy_args": {"predictor": "prompt"}}),
                                       run("shortest", 4.0, SJF)])
    assert oracle.oracle_label(coll) == "shortest"
    assert oracle.oracle_label(Collection(Path("."), runs=coll.runs[:2])) is None


def test_an_oracle_that_failed_everywhere_is_found_by_its_sweep_entry():
    coll = Collection(Path("."), runs=[run("dynamic", 4.0, DYNAMIC)],
                      failed=[FailedPoint("sjf", 4.0, 0, "worker-0 died")],
                      index={"base": {"strategy_args": {}}, "entries": [{"label": "dynamic", "strategy": "dynamic"},
                                                                        {"label": "sjf", "strategy": "sjf"}]})
    assert oracle.oracle_label(coll) == "sjf"
    lines = "\n".join(oracle.section(coll, {("dynamic", 4.0): group("dynamic", 4.0, 1.0, 2.0)}, None))
    assert "The oracle (sjf) failed at this rate: no ratios." in lines
    assert "× oracle" not in lines and re.search(r"\| sjf \| failed: 1 of 1 repeat\(s\); worker-0 died \| failed "
                                                 r"\| failed \|", lines)


def ratio_sweep(slos: bool) -> tuple[Collection, dict]:
    """dynamic 1.8× the oracle's mean E2E at 4 req/s; continuous failed at 4 (measured nothing)."""
    coll = Collection(Path("."), runs=[run("dynamic", 4.0, DYNAMIC), run("sjf", 4.0, SJF)],
                      failed=[FailedPoint("continuous", 4.0, 0, "measured nothing: 0 of 10 requests finished")])
    stats = {("dynamic", 4.0): group("dynamic", 4.0, 1.8, 3.0, 0.45 if slos else None),
             ("sjf", 4.0): group("sjf", 4.0, 1.0, 2.0, 0.9 if slos else None)}
    return coll, stats


def test_each_figure_is_given_as_a_ratio_to_the_oracle_at_the_same_rate():
    coll, stats = ratio_sweep(slos=True)
    lines = oracle.section(coll, stats, {"e2e": 5.0})
    assert "## Against the oracle" in lines and "### λ = 4 req/s" in lines
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| ")}
    assert rows["strategy"] == "| strategy | failed | E2E mean ms | E2E p99 ms | goodput |"
    assert rows["dynamic"] == ("| dynamic | 0 / 100 (0%) | 1800.0 (1.80× oracle) | 3000.0 (1.50× oracle) "
                               "| 45.0% (0.50× oracle) |")
    assert rows["sjf"] == "| sjf | 0 / 100 (0%) | 1000.0 (oracle) | 2000.0 (oracle) | 90.0% (oracle) |"


def test_a_failed_point_shows_failed_never_a_ratio():
    coll, stats = ratio_sweep(slos=False)
    row = next(line for line in oracle.section(coll, stats, None) if line.startswith("| continuous"))
    assert row == ("| continuous | failed: 1 of 1 repeat(s); measured nothing: 0 of 10 requests finished "
                   "| failed | failed |")


def test_a_point_with_a_failed_repeat_is_failed_though_another_completed():
    coll, stats = ratio_sweep(slos=False)
    coll.failed.append(FailedPoint("dynamic", 4.0, 1, "worker-0 died"))
    row = next(line for line in oracle.section(coll, stats, None) if line.startswith("| dynamic"))
    assert row == "| dynamic | failed: 1 of 2 repeat(s); worker-0 died | failed | failed |"


def test_no_goodput_column_without_slos_and_no_ratio_on_other_seeds():
    coll, stats = ratio_sweep(slos=False)
    coll.runs[0] = run("dynamic", 4.0, DYNAMIC, seed=7)
    lines = oracle.section(coll, stats, None)
    assert "| strategy | failed | E2E mean ms | E2E p99 ms |" in lines
    assert "| dynamic | 0 / 100 (0%) | 1800.0 | 3000.0 |" in lines


def test_without_an_oracle_the_section_is_absent():
    coll = Collection(Path("."), runs=[run("dynamic", 4.0, DYNAMIC),
                                       run("sjf", 4.0, {"strategy": "sjf", "strategy_args": {"predictor": "noisy"}})])
    assert oracle.section(coll, {("dynamic", 4.0): group("dynamic", 4.0, 1.0, 2.0)}, None) == []


def batchlab(*args: str) -> None:
    """A command in this process; it must exit 0."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


def simulated_sweep(out: Path, strategies: str, *extra: str) -> Path:
    batchlab("simulate", "--strategy", strategies, "--rate", "4,8", "--duration", "5", "--dataset", "synthetic",
             "--seed", "3", "--out", str(out), *extra)
    return out


@pytest.fixture(scope="module")
def three_strategies(tmp_path_factory) -> Path:
    """naive, dynamic and continuous at 4 and 8 req/s, simulated."""
    return simulated_sweep(tmp_path_factory.mktemp("three") / "sweep", "naive,dynamic,continuous")


@pytest.fixture(scope="module")
def dynamic_and_sjf(tmp_path_factory) -> Path:
    """dynamic and sjf at 4 and 8 req/s with outputs capped at 32 tokens, simulated."""
    return simulated_sweep(tmp_path_factory.mktemp("sjf") / "sweep", "dynamic,sjf", "--max-new-tokens", "32")


def copy(sweep: Path, tmp_path: Path) -> Path:
    shutil.copytree(sweep, tmp_path / "sweep")
    return tmp_path / "sweep"


def mean_e2e_s(point: Path) -> float:
    df = request_metrics(pd.read_parquet(point / "requests.parquet"))
    return float(df.loc[df["status"] == "finished", "e2e"].mean())


def as_oracle(root: Path, label: str, strategy_args: dict) -> None:
    """Mark one label's runs as sjf with these strategy_args (a stand-in until sjf is registered)."""
    for path in root.glob(f"{point_dir(label, 0, 0).parts[0]}/**/summary.json"):
        summary = json.loads(path.read_text())
        summary["settings"].update(strategy="sjf", strategy_args=strategy_args)
        path.write_text(json.dumps(summary))


@pytest.mark.slow
def test_a_simulated_sweep_with_an_oracle_by_settings_gets_ratios_and_keeps_its_headline(tmp_path, three_strategies):
    root = copy(three_strategies, tmp_path)
    batchlab("report", str(root))
    before = (root / "REPORT.md").read_text()
    assert "oracle" not in before.lower()  # no oracle entry: nothing said about it
    as_oracle(root, "continuous", {})  # missing predictor = oracle
    batchlab("report", str(root))
    text = (root / "REPORT.md").read_text()
    assert text.split("## Plots")[0] == before.split("## Plots")[0]  # the headline rule is unchanged
    section = text.split("## Against the oracle")[1].split("\n## ")[0]
    for rate in ("4", "8"):
        table = section.split(f"### λ = {rate} req/s")[1].split("###")[0]
        ratio = mean_e2e_s(root / point_dir("dynamic", float(rate), 0)) / mean_e2e_s(
            root / point_dir("continuous", float(rate), 0))
        dynamic = next(line for line in table.splitlines() if line.startswith("| dynamic |"))
        assert dynamic.split(" | ")[2].endswith(f"({ratio:.2f}× oracle)")
        assert re.search(r"\| continuous \| [^|]+ \| [0-9.]+ \(oracle\) \|", table)


def test_an_sjf_entry_with_another_predictor_adds_no_section(tmp_path, three_strategies):
    root = copy(three_strategies, tmp_path)
    as_oracle(root, "continuous", {"predictor": "prompt"})
    batchlab("report", str(root))
    assert "oracle" not in (root / "REPORT.md").read_text().lower()


def test_a_simulated_sweep_of_dynamic_and_sjf_reports_dynamic_against_the_oracle(tmp_path, dynamic_and_sjf):
    root = copy(dynamic_and_sjf, tmp_path)
    batchlab("report", str(root), "--slo", "e2e=5s")
    section = (root / "REPORT.md").read_text().split("## Against the oracle")[1].split("\n## ")[0]
    for rate in ("4", "8"):
        table = section.split(f"### λ = {rate} req/s")[1].split("###")[0]
        assert re.search(r"\| sjf \| [^|]+ \| [0-9.]+ \(oracle\) \| [0-9.]+ \(oracle\) \| [0-9.]+% \(oracle\) \|",
                         table)
        assert re.search(r"\| dynamic \| [^|]+ \| [0-9.]+ \([0-9.]+× oracle\) \| [0-9.]+ \([0-9.]+× oracle\) \|",
                         table)


def test_summary_and_setup_say_where_prompts_came_from_and_what_was_capped(tmp_path, dynamic_and_sjf):
    root = copy(dynamic_and_sjf, tmp_path)
    from batchlab.traffic.schedule import saved_notes

    point = root / point_dir("dynamic", 4, 0)
    notes = json.loads((point / "summary.json").read_text())["schedule"]
    assert notes == saved_notes(point / "schedule.parquet")
    assert notes["prompt_source"] == "synthetic" and notes["capped_outputs"] > 0
    batchlab("report", str(root))
    setup = (root / "REPORT.md").read_text().split("## Setup")[1]
    assert "- prompts: synthetic (uniform random token ids" in setup
    assert (f"- schedule at λ = 4 req/s: {json.loads((point / 'summary.json').read_text())['scheduled']} "
            f"requests; capped: {notes['capped_prompts']} prompt lengths to max_prompt_len 1024, "
            f"{notes['capped_outputs']} output lengths to max_new_tokens 32") in setup


def test_the_collector_reads_the_schedule_notes_from_the_footer_traffic_writes(tmp_path):
    from batchlab.collector.process import schedule_notes
    from batchlab.report.setup import PROMPT_SOURCES
    from batchlab.traffic import prompts, schedule

    assert PROMPT_SOURCES == prompts.PROMPT_SOURCES
    frame = pd.DataFrame({"request_id": [0], "arrival_offset_s": [0.0], "prompt": ["x"], "prompt_len": [1],
                          "output_len": [2], "prompt_tokens": [[5]]})
    notes = {"prompt_source": "synthetic-ids", "capped_prompts": 1, "capped_outputs": 0, "trace_speedup": 2.0}
    schedule.save_schedule(schedule.Schedule(frame, "h", 1.0, None, notes), tmp_path / "schedule.parquet")
    assert schedule_notes(tmp_path) == notes
    assert schedule_notes(tmp_path / "missing") == {}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "schedule.parquet").write_text("not parquet")
    assert schedule_notes(tmp_path / "bad") == {}


def test_the_setup_names_a_traces_window():
    from batchlab.report.setup import schedule_lines

    notes = {"prompt_source": "synthetic-ids", "capped_prompts": 2, "capped_outputs": 5, "trace_requests": 330,
             "trace_skipped_rows": 3, "trace_window_s": [600.0, 660.0], "trace_speedup": 1.0,
             "trace_native_rate": 5.5}
    summary = make_summary(scheduled=330, schedule=notes, settings={"max_prompt_len": 4096, "max_new_tokens": 512})
    r = RunData("dynamic", 0.0, 0, Path("."), summary, EMPTY, EMPTY, EMPTY, EMPTY)
    assert schedule_lines([r]) == [
        "- prompts: synthetic-ids (the trace's lengths; uniform random token ids)",
        ("- schedule at λ = 0 req/s: 330 requests; capped: 2 prompt lengths to max_prompt_len 4096, 5 output "
         "lengths to max_new_tokens 512; trace window [600, 660) s at 1× its speed (its own rate there 5.5 req/s); "
         "3 trace rows skipped (a zero length)")]
    assert schedule_lines([run("dynamic", 4.0, DYNAMIC)]) == []


@pytest.mark.slow  # real processes: the session's shared live sim run (synthetic prompts, 32 new tokens)
def test_a_live_runs_summary_holds_its_schedules_notes(dynamic_sim_run):
    from batchlab.traffic.schedule import saved_notes

    notes = json.loads((dynamic_sim_run / "summary.json").read_text())["schedule"]
    assert notes == saved_notes(dynamic_sim_run / "schedule.parquet") and notes["prompt_source"] == "synthetic"
