"""REPORT.md's peak memory cells say what they measure, and its settings table gives each setting one row."""
from pathlib import Path

import pandas as pd

from batchlab.report.markdown import memory_facts, rate_table
from batchlab.report.points import RunData
from batchlab.report.setup import knob_table
from batchlab.report.stats import GroupStats
from tests.summaries import make_summary

GIB = 2**30
ENV = {"cpu": "Xeon", "cpu_count": 2, "libraries": {"torch": "2.9", "vllm": "0.32"}}


def _run(label: str, settings: dict, **summary) -> RunData:
    empty = pd.DataFrame()
    return RunData(label, 2.0, 0, Path("."), make_summary(settings=settings, **summary), empty, empty, empty, empty)


def _group(label: str, peak: int) -> GroupStats:
    lat = {m: dict.fromkeys(("mean", "p50", "p90", "p99"), 0.01) for m in ("ttft", "tpot", "itl", "e2e")}
    return GroupStats(label, 2.0, 1, 100.0, 1.0, 20, 0, lat, {}, peak, 1.0, None)


def test_the_memory_column_names_each_backends_quantity_and_the_kv_pools_size():
    hf = _run("hf", {}, memory_kind="cpu_peak_rss", peak_memory_bytes=GIB)
    vllm = _run("vllm", {}, memory_kind="vllm_kv_pool", peak_memory_bytes=24 * 2**20,
                worker_stats={"worker-0": {"kv_pool_bytes": GIB}})
    table = "\n".join(rate_table([_group("hf", GIB), _group("vllm", 24 * 2**20)], False, memory_facts([hf, vllm])))
    assert "| 1024 MiB (CPU peak RSS) |" in table
    assert "| 24 MiB of 1024 MiB KV pool |" in table


def test_the_settings_table_has_one_row_per_setting_and_shared_environments_once():
    facts = {"backend": "vllm", "environment": ENV}
    runs = {lb: _run(lb, {"strategy": lb, "model": "tiny", "workers": {"worker-0": facts}})
            for lb in ("naive", "continuous")}
    text = "\n".join(knob_table(runs))
    assert "{" not in text  # no raw dict in a cell
    assert text.count("| worker.environment.libraries.torch | 2.9 |") == 1
    assert "| model | tiny |" in text
    shared, differ = text.split("Settings that differ between strategies:")
    assert "| strategy | naive | continuous |" in differ and "| strategy |" not in shared
