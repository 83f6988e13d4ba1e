"""What a run's summary gets when the run ends, beyond the collector's figures: computed once, by the
run, so that no reader (report, tune, benchmarks) ever rewrites a run's files."""
from pathlib import Path

from batchlab.protocol.run_dir import RunDir


def post_process(out: Path, deaths: list) -> None:
    """What the summary needs beyond the collector's figures, added when the run ends: the roles that
    died (for outcome.verdict), the traffic's send lag, and the simulator's replay of a live sim/echo
    run (`timing_fidelity`)."""
    from batchlab.collector.summary import read_summary, write_summary
    from batchlab.simulator.fidelity import add_run_fidelity

    add_run_fidelity(out)
    summary = read_summary(out)
    summary.harness_lag, summary.role_deaths = send_lag(out), deaths
    write_summary(out, summary)


def send_lag(out: Path) -> dict:
    """How late the traffic sent each request after its planned arrival, s (p50, p99, max)."""
    import numpy as np
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(RunDir(out).table("requests"), columns=["arrival_time", "send_time"])
    except (OSError, KeyError, ValueError):
        return {}
    lag = table["send_time"].to_numpy(zero_copy_only=False) - table["arrival_time"].to_numpy(zero_copy_only=False)
    lag = lag[np.isfinite(lag)]
    if not lag.size:
        return {}
    p50, p99 = np.percentile(lag, [50, 99])
    arrivals = table["arrival_time"].to_numpy(zero_copy_only=False)
    return {"p50": float(p50), "p99": float(p99), "max": float(lag.max()),
            "last_arrival_s": float(np.nanmax(arrivals))}  # planned: what the schedule offered
