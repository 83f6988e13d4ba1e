"""Timing fidelity: a live `sim`/`echo` run against the simulator's ground truth on the same schedule.

A post-processing step over a finished run folder (`batchlab report` runs it; so do the benchmarks that
print it), never part of the run itself. The simulator plays the run's schedule, policy and step model
in virtual time, where messages take no time and sleeps end exactly. Matching request ids, live minus
simulated TTFT, TPOT, e2e and queue wait is what the harness itself adds (message hops, scheduling,
sleep overshoot, CPU contention). It is written into summary.json as `timing_fidelity`:

    {"backend", "simulated_requests", "matched", "live_only", "sim_only", "sim_wall_s",
     "ttft_error_s": {"mean", "p50", "p99", "max_abs"}, "tpot_error_s": {...},
     "e2e_error_s": {...}, "queue_wait_error_s": {...}}

Errors are seconds, positive when the live run is slower. A failure here is logged, never raised.
"""
import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from batchlab.collector.parts import read_schedule
from batchlab.collector.summary import SummaryError, read_summary, write_summary
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig, build_config
from batchlab.simulator.run import simulate
from batchlab.stats.metrics import percentiles
from batchlab.traffic.schedule import Schedule
from batchlab.protocol.status import RequestStatus

log = logging.getLogger(__name__)

FIDELITY_BACKENDS = ("sim", "echo")  # backends whose step times the simulator knows exactly
# A longer run is compared on its first ones (timing_fidelity): simulated whole, a 60 s soak at 5,000 req/s held
# 3 GiB in the launcher after its roles had exited, and 10,000 requests of 500 tokens 3.6 GiB (the simulation's
# tables have a row per token)
MAX_SIMULATED_REQUESTS = 20_000
MAX_SIMULATED_TOKENS = 200_000  # output tokens of the prefix simulated
METRICS = ("ttft", "tpot", "e2e", "queue_wait")
LIVE_COLUMNS = ["request_id", "status", *METRICS]  # what the comparison reads of the run's requests.parquet
ERROR_STATS = ("mean", "p50", "p99", "max_abs")


def config_from_settings(settings: dict, strategy_code: bytes = b"") -> RunConfig:
    """The RunConfig a run's settings (RunInfo) came from, checked like any other; keys that are not
    RunConfig fields (host, t0, ...) are dropped. `strategy_code`: the strategy class the run was given by value
    (the settings hold only its digest)."""
    names = set(RunConfig.model_fields) - {"extra"}
    values = {k: v for k, v in settings.items() if k in names}
    if isinstance(values.get("workers"), dict):  # RunInfo replaces the count with the workers' hellos
        values["workers"] = len(values["workers"])
    cfg = build_config(values, {})
    cfg._strategy_code = strategy_code
    return cfg


def compare(live: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Per-request live − simulated metrics over the requests finished in both tables."""
    cols = ["request_id", *METRICS]
    live_ok = live.loc[live["status"] == RequestStatus.FINISHED, cols]
    sim_ok = sim.loc[sim["status"] == RequestStatus.FINISHED, cols]
    both = live_ok.merge(sim_ok, on="request_id", suffixes=("_live", "_sim"))
    out = {"matched": len(both), "live_only": len(live_ok) - len(both), "sim_only": len(sim_ok) - len(both)}
    for name in METRICS:
        out[f"{name}_error_s"] = percentiles(both[f"{name}_live"] - both[f"{name}_sim"], ERROR_STATS)
    return out


def timing_fidelity(live_requests: pd.DataFrame, settings: dict, schedule: pd.DataFrame | None,
                    strategy_code: bytes = b"") -> dict | None:
    """The run's fidelity block, or None when the backend's true timings are unknown, the run was itself
    simulated, or there is no schedule.

    A run of more than MAX_SIMULATED_REQUESTS requests (or MAX_SIMULATED_TOKENS output tokens) is compared on
    its first ones: that prefix of its schedule simulated alone plays exactly what the whole would until the
    prefix's last arrival (a policy decides from what has happened; the prefix's end of stream comes at that
    arrival), so the requests simulated to complete before it are compared (`simulated_requests`: the
    prefix's size); the simulation's tables, a row per token, then fit in bounded memory whatever the run's
    length."""
    if settings.get("backend") not in FIDELITY_BACKENDS or settings.get("simulated") or schedule is None:
        return None
    cfg = config_from_settings(settings, strategy_code)
    start_s = time.perf_counter()
    tokens = schedule["output_len"].to_numpy().cumsum()
    n = min(MAX_SIMULATED_REQUESTS, max(int(np.searchsorted(tokens, MAX_SIMULATED_TOKENS, side="right")), 1))
    prefix = schedule.iloc[:n].reset_index(drop=True)
    end_s = float(prefix["arrival_offset_s"].to_numpy().max(initial=0.0))
    sim = simulate(cfg, Schedule(prefix, "", end_s)).requests
    if len(prefix) < len(schedule):
        sim = sim[sim["completion_time"] < end_s]
        live_requests = live_requests[live_requests["request_id"].isin(sim["request_id"])]
    result = {"backend": cfg.backend, "simulated_requests": len(prefix), **compare(live_requests, sim)}
    result["sim_wall_s"] = time.perf_counter() - start_s
    return result


def add_run_fidelity(run_dir: str | Path, strategy_code: bytes = b"") -> dict | None:
    """A finished run folder's summary.json gains `timing_fidelity` unless it has one (live sim/echo runs
    with their requests table and schedule only); returns the block, or None. Any failure of the
    simulation is logged and the block left out: a post-processing step never breaks a run or a report.
    `strategy_code`: the run's strategy class when it was passed by value."""
    folder = RunDir(run_dir)
    try:
        summary = read_summary(folder.path)
    except SummaryError:  # unreadable: whoever reads the run reports that
        return None
    if summary.timing_fidelity is not None or not folder.table("requests").is_file() or not folder.schedule.is_file():
        return summary.timing_fidelity
    if summary.settings.get("backend") not in FIDELITY_BACKENDS or summary.settings.get("simulated"):
        return None
    try:
        live = pq.read_table(folder.table("requests"), columns=LIVE_COLUMNS).to_pandas()
        summary.timing_fidelity = timing_fidelity(live, summary.settings, read_schedule(folder.path), strategy_code)
    except Exception:
        log.exception("timing fidelity skipped: the simulation of this run failed")
        return None
    if summary.timing_fidelity is not None:
        try:
            write_summary(folder.path, summary)
        except OSError as exc:  # a read-only copy of a run: the block is still returned
            log.warning("timing fidelity of %s not saved: %s", folder.path, exc)
    return summary.timing_fidelity

