"""Timing fidelity: a live `sim`/`echo` run against the simulator's ground truth on the same schedule.

The simulator plays the run's schedule, policy and step model in virtual time, where messages take no
time and sleeps end exactly. Matching request ids, live minus simulated TTFT, TPOT, e2e and queue wait
is what the harness itself adds (message hops, scheduling, sleep overshoot, CPU contention). It is
written into summary.json as `timing_fidelity`:

    {"backend", "matched", "live_only", "sim_only", "sim_wall_s",
     "ttft_error_s": {"mean", "p50", "p99", "max_abs"}, "tpot_error_s": {...},
     "e2e_error_s": {...}, "queue_wait_error_s": {...}}

Errors are seconds, positive when the live run is slower. A failure here is logged, never raised.
"""
import logging
import time
from dataclasses import fields

import numpy as np
import pandas as pd

from batchlab.protocol.settings import RunConfig

log = logging.getLogger(__name__)

FIDELITY_BACKENDS = ("sim", "echo")  # backends whose step times the simulator knows exactly
METRICS = ("ttft", "tpot", "e2e", "queue_wait")


def config_from_settings(settings: dict) -> RunConfig:
    """The RunConfig a run's settings (RunInfo) came from; keys that are not RunConfig fields are dropped."""
    names = {f.name for f in fields(RunConfig)} - {"extra"}
    values = {k: v for k, v in settings.items() if k in names}
    if isinstance(values.get("workers"), dict):  # RunInfo replaces the count with the workers' hellos
        values["workers"] = len(values["workers"])
    return RunConfig(**values)


def error_stats(errors: pd.Series) -> dict:
    """{mean, p50, p99, max_abs} of the non-NaN errors (None each when there are none)."""
    values = errors.dropna().to_numpy(dtype="float64")
    if values.size == 0:
        return {"mean": None, "p50": None, "p99": None, "max_abs": None}
    p50, p99 = np.percentile(values, [50, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p99": float(p99),
            "max_abs": float(np.abs(values).max())}


def compare(live: pd.DataFrame, sim: pd.DataFrame) -> dict:
    """Per-request live − simulated metrics over the requests finished in both tables."""
    cols = ["request_id", *METRICS]
    live_ok = live.loc[live["status"] == "finished", cols]
    sim_ok = sim.loc[sim["status"] == "finished", cols]
    both = live_ok.merge(sim_ok, on="request_id", suffixes=("_live", "_sim"))
    out = {"matched": len(both), "live_only": len(live_ok) - len(both), "sim_only": len(sim_ok) - len(both)}
    for name in METRICS:
        out[f"{name}_error_s"] = error_stats(both[f"{name}_live"] - both[f"{name}_sim"])
    return out


def timing_fidelity(live_requests: pd.DataFrame, settings: dict, schedule: pd.DataFrame | None) -> dict | None:
    """The run's fidelity block, or None when the backend's true timings are unknown or there is no schedule."""
    if settings.get("backend") not in FIDELITY_BACKENDS or schedule is None:
        return None
    from batchlab.scheduler.simulator.run import simulate  # the simulator is needed only here
    from batchlab.traffic.schedule import Schedule

    cfg = config_from_settings(settings)
    start_s = time.perf_counter()
    sim = simulate(cfg, Schedule(schedule, "", float(schedule["arrival_offset_s"].to_numpy().max(initial=0.0))))
    result = {"backend": cfg.backend, **compare(live_requests, sim.requests)}
    result["sim_wall_s"] = time.perf_counter() - start_s
    return result


def add_timing_fidelity(summary: dict, live_requests: pd.DataFrame, settings: dict,
                        schedule: pd.DataFrame | None) -> None:
    """summary["timing_fidelity"] for sim/echo runs; any failure is logged and the key left out."""
    try:
        result = timing_fidelity(live_requests, settings, schedule)
    except Exception:  # the simulator must never break the collector
        log.exception("timing fidelity skipped: the simulation of this run failed")
        return
    if result is not None:
        summary["timing_fidelity"] = result
