"""The report's honesty rules on hand-written sweep folders: failed shares beside every latency, a point
that measured nothing is a failed point (never a rate-0 row), and the headline rule stated in REPORT.md."""
import json
from pathlib import Path

import pandas as pd
import pytest

from batchlab.collector.layout import point_dir
from batchlab.collector.summary import Summary, write_summary
from batchlab.protocol.status import FailureReason
from batchlab.report import plots
from batchlab.report.build import run_report
from batchlab.report.markdown import render
from batchlab.report.points import load_collection
from batchlab.report.stats import all_stats
from batchlab.stats.metrics import summarize

NOT_SENT = FailureReason.NOT_SENT

DIED = "worker-0 died: CUDA out of memory"


def write_run(folder: Path, rate: float | None, finished: int, failed: int, ttft_s: float = 0.1,
              error: str = DIED, label: str = "naive") -> None:
    """A run folder: `finished` requests one per 1/rate s (3 tokens each), then `failed` ones with `error`."""
    folder.mkdir(parents=True)
    n, gap_s = finished + failed, 1.0 / (rate or 1.0)
    arrival = [i * gap_s for i in range(n)]
    ok = [i < finished for i in range(n)]
    requests = pd.DataFrame({
        "request_id": range(n), "status": ["finished" if k else "failed" for k in ok],
        "error": ["" if k else error for k in ok], "prompt_len": 8, "output_len": 3,
        "arrival_time": arrival, "scheduled_time": [a + ttft_s / 2 if k else float("nan") for a, k in zip(arrival, ok)],
        "first_token_time": [a + ttft_s if k else float("nan") for a, k in zip(arrival, ok)],
        "completion_time": [a + ttft_s + 0.02 if k else float("nan") for a, k in zip(arrival, ok)],
        "n_tokens": [3 if k else 0 for k in ok], "submitted": [error != NOT_SENT or k for k in ok]})
    tokens = pd.DataFrame({"request_id": [i for i in range(finished) for _ in range(3)],
                           "token_index": [j for _ in range(finished) for j in range(3)],
                           "time": [arrival[i] + ttft_s + 0.01 * j for i in range(finished) for j in range(3)]})
    requests.to_parquet(folder / "requests.parquet")
    tokens.to_parquet(folder / "tokens.parquet")
    settings = {"strategy": label, "backend": "sim", "duration_s": 4} | ({"rate": rate} if rate else {})
    write_summary(folder, Summary.model_validate(summarize(requests, tokens, settings)))  # as the collector does


def write_sweep(root: Path, points: list[tuple[str, float, int, int, dict]]) -> Path:
    """sweep.json plus a folder per (label, planned rate, finished, failed, write_run overrides) point."""
    index = {"rates": sorted({p[1] for p in points}), "repeats": 1, "seed": 0, "points": []}
    for label, rate, finished, failed, extra in points:
        folder = root / point_dir(label, rate, 0)
        write_run(folder, extra.pop("settings_rate", rate), finished, failed, label=label, **extra)
        index["points"].append({"label": label, "rate": rate, "repeat": 0, "status": "done", "reason": "",
                                "dir": str(point_dir(label, rate, 0))})
    (root / "sweep.json").write_text(json.dumps(index))
    return root


@pytest.fixture
def sweep(tmp_path) -> Path:
    """naive and dynamic at 4 and 8 req/s (naive drops 5% at 8); vLLM at 4 fine, at 8 measured nothing."""
    return write_sweep(tmp_path, [
        ("naive", 4.0, 40, 0, {"ttft_s": 0.2}), ("dynamic", 4.0, 40, 0, {"ttft_s": 0.1}),
        ("vllm", 4.0, 40, 0, {"ttft_s": 0.05}),
        ("naive", 8.0, 95, 5, {"ttft_s": 0.4}), ("dynamic", 8.0, 100, 0, {"ttft_s": 0.1}),
        ("vllm", 8.0, 0, 228, {"settings_rate": None})])


def report_of(root: Path) -> str:
    """REPORT.md text without drawing plots."""
    coll = load_collection(root)
    return render(coll, all_stats(coll), [], [], None, None)


def test_a_point_that_measured_nothing_is_a_failed_point_with_its_first_error(sweep):
    coll = load_collection(sweep)
    assert [(r.label, r.rate) for r in coll.runs if r.label == "vllm"] == [("vllm", 4.0)]
    [point] = coll.failed
    assert (point.label, point.rate) == ("vllm", 8.0)
    assert point.reason == f"measured nothing: 0 of 228 requests finished; {DIED}"
    text = report_of(sweep)
    assert "λ = 0" not in text and "| vllm | 0 |" not in text
    assert f"- vllm λ = 8 rep 0: failed: measured nothing: 0 of 228 requests finished; {DIED}" in text
    assert "| vllm | 8 |" not in text and "| vllm | 4 |" in text  # gone from the interval tables too


def test_a_point_whose_requests_were_never_sent_names_that_and_never_gets_rate_zero(tmp_path):
    write_sweep(tmp_path, [("naive", 4.0, 10, 0, {}), ("vllm", 4.0, 0, 30, {"error": NOT_SENT})])
    [point] = load_collection(tmp_path).failed
    assert point.rate == 4.0 and point.reason == f"measured nothing: 0 of 30 requests finished; {NOT_SENT}"


def test_rate_comes_from_the_planned_folder_not_the_settings(tmp_path):
    write_run(tmp_path / point_dir("dynamic", 6, 0), None, 12, 0, label="dynamic")  # no rate in settings
    coll = load_collection(tmp_path)
    assert [r.rate for r in coll.runs] == [6.0] and not coll.failed


def test_a_single_run_without_a_rate_is_not_a_rate_zero_row(tmp_path):
    write_run(tmp_path / "one", None, 12, 0)
    coll = load_collection(tmp_path)
    assert not coll.runs and coll.failed[0].reason == "measured nothing: no planned rate"


def test_every_latency_table_shows_the_failed_share(sweep):
    text = report_of(sweep)
    for section in ("### λ = 8 req/s", "## Confidence intervals", "## TPOT and ITL by other tools"):
        table = [ln for ln in text.split(section)[1].split("\n## ")[0].splitlines() if ln.startswith("|")]
        assert "failed" in [c.strip() for c in table[0].strip("|").split("|")], section
        row = next(ln for ln in table if ln.startswith("| naive |") and ("| 8 |" in ln or section.startswith("###")))
        assert "| 5 / 100 (5%) |" in row, section


@pytest.mark.slow
def test_report_states_the_headline_rule_and_compares_latency_at_a_load_both_sustain(sweep):
    result = run_report(str(sweep))
    text = result.path.read_text()
    dynamic = next(h for h in result.headlines if h.startswith("Dynamic batching"))
    # naive dropped 5% at 8: its bracket from the grid is [4, 8] nominal (offered over the 4 s: 4.25, 8.25);
    # dynamic sustained both rates: open above
    assert ("capacity not compared to naive batching, a bracket is open (naive 5.92 [4.25, 8.25] → dynamic ≥ 8.25 "
            "(no failing rate measured) req/s)") in dynamic
    assert "At λ = 4 req/s" in dynamic and "TTFT p50 −50" in dynamic  # 4 ≤ 0.8 × 5.92; 8 is not
    assert "By a fixed rule: throughput = each strategy's saturated throughput μ" in text
    assert text.index("## Capacity") < text.index("## Result")


def figure_texts(monkeypatch) -> list[str]:
    """Capture every text a plot function draws (annotations, legends, titles) instead of saving it."""
    seen: list[str] = []

    def capture(fig, path):
        for ax in fig.axes:
            seen.extend(t.get_text() for t in ax.texts)
            if ax.get_legend():
                seen.extend(t.get_text() for t in ax.get_legend().get_texts())
            reds = [c for c in ax.collections if c.get_facecolor().tolist() == [[1.0, 0.0, 0.0, 1.0]]]
            seen.append(f"red marks: {sum(len(c.get_offsets()) for c in reds)}")
        seen.append(fig._suptitle.get_text() if fig._suptitle else "")
        return path

    monkeypatch.setattr(plots, "save", capture)
    return seen


def test_latency_curves_mark_points_with_failures(sweep, monkeypatch, tmp_path):
    seen = figure_texts(monkeypatch)
    coll = load_collection(sweep)
    plots.latency_vs_throughput(all_stats(coll), coll.labels(), tmp_path / "x.png")
    assert "λ=8, 5% failed" in seen and "λ=4" in seen and "λ=8" in seen  # dynamic at 8 failed none
    assert any("red x marks > 1% failed" in s for s in seen)
    assert seen.count("red marks: 1") == 4  # naive at 8, in each of the four panels


def test_latency_cdfs_give_the_failed_share_in_the_legend(sweep, monkeypatch, tmp_path):
    seen = figure_texts(monkeypatch)
    coll = load_collection(sweep)
    plots.latency_cdfs(coll, all_stats(coll), 8.0, tmp_path / "x.png")
    assert "naive (failed 5 / 100 (5%))" in seen and "dynamic (failed 0 / 100 (0%))" in seen
    assert not any(s.startswith("vllm") for s in seen)
