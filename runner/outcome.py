"""What a run's end says: an exit code and one line naming the cause (pure: a summary and the roles'
deaths in, a verdict out), shared by `batchlab run` and `batchlab sweep`. The codes (0 the run's own
rules, 2 a fault, 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP) are docs/faults.md's table.

And what a run's summary gets when the run ends, beyond the collector's figures (post_process): computed
once, by the run, so that no reader (report, tune, benchmarks) ever rewrites a run's files.
"""
import os
import signal
from pathlib import Path

from batchlab.collector.summary import Summary
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.errors import UNGUARDED_MAIN, UNGUARDED_MAIN_EXIT
from batchlab.protocol.status import FailureKind

OK_EXIT = 0
FAULT_EXIT = 2
ERRNO_EXIT_MAX = 63  # a role that crashed on an OSError exits with its errno when 2 ≤ errno ≤ this (1: any crash)
SIGNAL_EXIT_BASE = 128  # a role stopped by a signal exits 128 + the signal's number
MAX_CAUSE_CHARS = 300  # a crashed role's exception, as its verdict line quotes it

# Failure reasons that are faults, by prefix: a request lost to a role's end, a stall or a stop. Every
# other reason is a result the run's own rules produced. Prefixes of protocol.status's reasons and kinds, so
# that a reason's variant text (an older folder's) still counts.
FAULT_PREFIXES = ("worker lost", "worker rejoined", "worker stopped", "worker error", "scheduler stopped",
                  "stalled", "not sent", "no terminal record")


def interrupted_exit(exc: BaseException) -> int:
    """The exit code of a command stopped by `exc` (a KeyboardInterrupt): 128 + its signal (runner.stop_signal),
    143 for a SIGTERM, 129 for a SIGHUP (its terminal closed), else 130 (a Ctrl-C)."""
    from batchlab.protocol.signals import stop_signal

    return SIGNAL_EXIT_BASE + stop_signal(exc)


def is_fault(reason: str) -> bool:
    """True for a failure reason that a fault caused (not a rule of the run)."""
    return reason.startswith(FAULT_PREFIXES)


def exit_code_for(exc: BaseException) -> int:
    """A crashed role's exit code: its errno for an OSError (so a full disk can be named), else 1."""
    errno = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    return errno if isinstance(errno, int) and 2 <= errno <= ERRNO_EXIT_MAX else 1


def exception_line(exc: BaseException) -> str:
    """An exception as one short line: its type and message ("RuntimeError: this policy always fails")."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= MAX_CAUSE_CHARS else line[:MAX_CAUSE_CHARS - 1] + "…"


def death_line(name: str, exitcode: int, *, started: bool = True, cause: str = "") -> str:
    """One line for a role that ended before the run's end with `exitcode` (multiprocessing's: −N for
    signal N): `started` False while the traffic had no Start yet (start-up); `cause`: the exception it
    crashed with (exception_line), when it wrote one."""
    when = "mid-run" if started else "during start-up"
    if exitcode == UNGUARDED_MAIN_EXIT:  # api.guard: the child re-ran the caller's script
        return f"{name} stopped during start-up: {UNGUARDED_MAIN}"
    if exitcode == 1 and cause:  # a crash on an exception other than an OSError's errno (exit_code_for)
        return f"{name} crashed {when}: {cause}; see its log in the out folder's logs/"
    if 2 <= exitcode <= ERRNO_EXIT_MAX:
        cause = os.strerror(exitcode)
        return f"collector could not write: {cause}" if name == "collector" else f"{name} died: {cause}"
    if exitcode < 0 or exitcode > SIGNAL_EXIT_BASE:
        number = -exitcode if exitcode < 0 else exitcode - SIGNAL_EXIT_BASE
        how = "killed by" if exitcode < 0 else "stopped by"
        return f"{name} {how} {_signal_name(number)} {when}; see its log in the out folder's logs/"
    return f"{name} died (exit code {exitcode}) {when}; see its log in the out folder's logs/"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def verdict(summary: Summary | None, deaths: list[str]) -> tuple[int, str]:
    """(exit code, one line) for a run: its summary (None: none was written) and its roles' deaths
    (death_line's, in order). The line is "" when the code is 0."""
    lost = 0 if summary is None else sum(n for r, n in summary.failure_reasons.items() if is_fault(r))
    tail = f"; {lost} of {summary.scheduled} requests lost to faults" if lost else ""
    if deaths:
        return FAULT_EXIT, deaths[0] + tail
    if summary is None:
        return FAULT_EXIT, "the collector wrote no summary"
    reasons = {r: n for r, n in summary.failure_reasons.items() if is_fault(r)}
    if not reasons:
        return OK_EXIT, ""
    stalled = [r for r in reasons if str(r).startswith(FailureKind.STALLED)]
    top = stalled[0] if stalled else max(reasons, key=lambda r: reasons[r])
    more = f" ({len(reasons)} fault reasons: see failure_reasons in summary.json)" if len(reasons) > 1 else ""
    return FAULT_EXIT, f"{top}{tail}{more}"


def post_process(out: Path, deaths: list, beside=None, strategy_code: bytes = b"") -> None:
    """What the summary needs beyond the collector's figures, added when the run ends: the roles that
    died (for outcome.verdict), the traffic's send lag, the rest of the machine's CPU while it ran
    (`beside`: a stats.interference.Interference, None when not metered) and the simulator's replay of
    a live sim/echo run (`timing_fidelity`; `strategy_code`: its strategy class when passed by value)."""
    from batchlab.collector.summary import read_summary, write_summary
    from batchlab.simulator.fidelity import add_run_fidelity

    add_run_fidelity(out, strategy_code)
    summary = read_summary(out)
    summary.harness_lag, summary.role_deaths = send_lag(out), deaths
    if beside is not None:
        summary.interference = beside.as_dict()
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
