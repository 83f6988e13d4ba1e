"""Timing fidelity: a live `sim`/`echo` run against the simulator's ground truth on the same schedule.

A post-processing step over a finished run folder (`batchlab report` runs it; so do the benchmarks that
print it), never part of the run itself. The simulator plays the run's schedule, policy and step model
in virtual time, where messages take no time and sleeps end exactly. Matching request ids, live minus
simulated TTFT, TPOT, e2e and queue wait is what the harness itself adds (message hops, scheduling,
sleep overshoot, CPU contention). It is written into summary.json as `timing_fidelity`:

    {"backend", "matched", "live_only", "sim_only", "sim_wall_s",
     "ttft_error_s": {"mean", "p50", "p99", "max_abs"}, "tpot_error_s": {...},
     "e2e_error_s": {...}, "queue_wait_error_s": {...}}

Errors are seconds, positive when the live run is slower. A failure here is logged, never raised.
"""
import json
import logging
import time
import typing
from pathlib import Path

import pandas as pd

from batchlab.collector.layout import SUMMARY_FILE
from batchlab.collector.metrics import percentiles
from batchlab.collector.parts import SCHEDULE_FILE, load_table, read_schedule, write_summary
from batchlab.protocol.settings import RunConfig, build_config
from batchlab.simulator.run import simulate
from batchlab.traffic.schedule import Schedule

log = logging.getLogger(__name__)

FIDELITY_BACKENDS = ("sim", "echo")  # backends whose step times the simulator knows exactly
METRICS = ("ttft", "tpot", "e2e", "queue_wait")
ERROR_STATS = ("mean", "p50", "p99", "max_abs")
KEY = "timing_fidelity"  # summary.json's key


def config_from_settings(settings: dict) -> RunConfig:
    """The RunConfig a run's settings (RunInfo) came from, checked like any other; keys that are not
    RunConfig fields (host, t0, ...) are dropped."""
    names = set(typing.get_type_hints(RunConfig)) - {"extra"}
    values = {k: v for k, v in settings.items() if k in names}
    if isinstance(values.get("workers"), dict):  # RunInfo replaces the count with the workers' hellos
        values["workers"] = len(values["workers"])
    return build_config(values, {})


def compare(live: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Per-request live − simulated metrics over the requests finished in both tables."""
    cols = ["request_id", *METRICS]
    live_ok = live.loc[live["status"] == "finished", cols]
    sim_ok = sim.loc[sim["status"] == "finished", cols]
    both = live_ok.merge(sim_ok, on="request_id", suffixes=("_live", "_sim"))
    out = {"matched": len(both), "live_only": len(live_ok) - len(both), "sim_only": len(sim_ok) - len(both)}
    for name in METRICS:
        out[f"{name}_error_s"] = percentiles(both[f"{name}_live"] - both[f"{name}_sim"], ERROR_STATS)
    return out


def timing_fidelity(live_requests: pd.DataFrame, settings: dict, schedule: pd.DataFrame | None) -> dict | None:
    """The run's fidelity block, or None when the backend's true timings are unknown, the run was itself
    simulated, or there is no schedule."""
    if settings.get("backend") not in FIDELITY_BACKENDS or settings.get("simulated") or schedule is None:
        return None
    cfg = config_from_settings(settings)
    start_s = time.perf_counter()
    end_s = float(schedule["arrival_offset_s"].to_numpy().max(initial=0.0))
    sim = simulate(cfg, Schedule(schedule, "", end_s))
    result = {"backend": cfg.backend, **compare(live_requests, sim.requests)}
    result["sim_wall_s"] = time.perf_counter() - start_s
    return result


def add_timing_fidelity(summary: dict, live_requests: pd.DataFrame, settings: dict,
                        schedule: pd.DataFrame | None) -> None:
    """summary["timing_fidelity"] for live sim/echo runs; any failure is logged and the key left out."""
    try:
        result = timing_fidelity(live_requests, settings, schedule)
    except Exception:  # a post-processing step must never break the report or the benchmark
        log.exception("timing fidelity skipped: the simulation of this run failed")
        return
    if result is not None:
        summary[KEY] = result


def add_run_fidelity(run_dir: str | Path) -> dict | None:
    """A finished run folder's summary.json gains `timing_fidelity` unless it has one (live sim/echo runs
    with their requests table and schedule only); returns the block, or None."""
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):  # unreadable: whoever reads the run reports that
        return None
    if KEY in summary or not (run_dir / "requests.parquet").is_file() or not (run_dir / SCHEDULE_FILE).is_file():
        return summary.get(KEY)
    settings = summary.get("settings") or {}
    if settings.get("backend") not in FIDELITY_BACKENDS or settings.get("simulated"):
        return None
    add_timing_fidelity(summary, load_table(run_dir, "requests"), settings, read_schedule(run_dir))
    if KEY in summary:
        try:
            write_summary(run_dir, summary)
        except OSError as exc:  # a read-only copy of a run: the block is still returned
            log.warning("timing fidelity of %s not saved: %s", run_dir, exc)
    return summary.get(KEY)


def add_folder_fidelity(folder: str | Path) -> int:
    """add_run_fidelity for every run folder under `folder` (itself included); how many hold a block."""
    return sum(add_run_fidelity(path.parent) is not None for path in sorted(Path(folder).rglob(SUMMARY_FILE)))
