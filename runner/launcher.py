"""`batchlab run`: start collector, scheduler, worker(s) and traffic as processes and watch them."""
import contextlib
import json
import logging
import multiprocessing as mp
import shutil
import signal
import time
from dataclasses import dataclass, field
from multiprocessing import connection
from pathlib import Path

import yaml

from batchlab.protocol.outcomes import RunOutcome
from batchlab.runner import outcome, procs, remove_temp_of, roles
from batchlab.runner.cpu_meter import CpuMeter
from batchlab.runner.procs import Child
from batchlab.runner.outcome import post_process
from batchlab.runner.run_folder import RunRecord
from batchlab.collector.summary import Summary, read_summary
from batchlab.protocol.files import write_text_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig
from batchlab.protocol.signals import raise_if_stopped, sigint_ignored
from batchlab.protocol.addresses import Addresses
from batchlab.protocol.errors import RunFailed, RunTimeout

log = logging.getLogger("batchlab.launcher")
POLL_S = 0.2
STOP_GRACE_S = 30.0  # how long children get to finish after a stop before they are killed
COLLECTOR_GRACE_S = 12.0  # the collector's own wait for worker byes is 10 s
SILENT_AT_START_S = 3.0  # a collector silent this long when start-up passes its limit is named as the cause


@dataclass(slots=True)
class Limits:
    """How long a run may take: start-up (process start until the traffic's Start: model loads, engine
    compilation, warm-up) and the run itself (from its first request). 0: no limit."""

    startup_s: float | None = None  # None: the run's own startup_limit_s
    run_s: float = 0.0


def _limits(limits: Limits | None, cfg: RunConfig) -> Limits:
    """The limits given, the start-up limit the run's own where none is given."""
    limits = limits or Limits()
    return Limits(cfg.startup_limit_s if limits.startup_s is None else limits.startup_s, limits.run_s)


def _entry(stop_asked, target, args: tuple, out_dir: str | None = None) -> None:
    """Child main: its own process group, its terminal output into its log folder, then the role; its
    return value is the exit code; a crash goes into its log too (exit code: outcome.exit_code_for).
    A child that outlived its launcher removes the launcher's temp folder on its way out."""
    name = mp.current_process().name
    procs.become_group_leader(stop_asked, outlives_group_signals=name == "collector")
    try:
        if out_dir:
            procs.redirect_output(RunDir(out_dir).logs / f"{name}.out")
        code = target(*args)
    except Exception as exc:
        logging.getLogger("batchlab").exception("%s crashed", name)
        code = outcome.exit_code_for(exc)
        if out_dir:  # the launcher's verdict names it (its type and message), not just an exit code
            with contextlib.suppress(OSError):
                RunDir(out_dir).crash(name).write_text(outcome.exception_line(exc))
    finally:
        if procs.orphaned():
            remove_temp_of(procs.launcher_pid())
    raise SystemExit(code)


def start_role(ctx, name: str, target, *args, out_dir: str | None = None) -> Child:
    """Start a role as a process leading its own group; its terminal output goes to OUT/logs/NAME.out."""
    return procs.start(ctx, name, _entry, target, args, out_dir)


def launch_run(cfg: RunConfig, *, slos: dict | None = None, on_tick=None, pool=None,
               limits: Limits | None = None) -> Summary:
    """Run everything to the end; return the summary. Raises RunFailed naming a dead child, RunTimeout
    past a limit. With `pool` (a runner.pool.WorkerPool) its warm workers join this run instead of new ones.
    Every process this run started, and every process those started, is gone when it returns."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    RunDir(out).config.write_text(yaml.safe_dump(cfg.as_settings(), sort_keys=False))
    record = RunRecord(out, cfg)
    try:
        summary = _launch(_with_schedule(cfg, out), out, slos, on_tick, pool, limits)
    except KeyboardInterrupt as exc:
        from batchlab.protocol.signals import stop_signal

        how = stop_signal(exc)
        record.end(RunOutcome.INTERRUPTED, "Ctrl-C" if how == signal.SIGINT else how.name)
        raise
    except RunTimeout as exc:
        record.end(RunOutcome.STOPPED if exc.phase == "run" else RunOutcome.FAILED, str(exc))
        raise
    except BaseException as exc:
        record.end(RunOutcome.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    code, line = outcome.verdict(summary, summary.role_deaths)  # what `batchlab run`'s exit code will say
    record.end(RunOutcome.DONE if code == outcome.OK_EXIT else RunOutcome.FAILED, line, finished=summary.finished,
               failed=summary.failed, role_deaths=summary.role_deaths)
    return summary


def _launch(cfg: RunConfig, out: Path, slos: dict | None, on_tick, pool, limits: Limits | None) -> Summary:
    """launch_run's processes, from start to the summary (post-processed: a sim/echo run's timing
    fidelity is computed here, once, so that no reader ever rewrites a run's files)."""
    raise_if_stopped()  # a Ctrl-C that a library swallowed while the command imported: no process is started
    procs.clean_stale_temp()
    procs.start_resource_tracker()
    ctx = mp.get_context("spawn")  # fork is unsafe with torch/vLLM threads
    stream_ended = ctx.Event()  # set when traffic dies: the scheduler then ends the stream
    traffic_started = ctx.Event()  # set when the traffic got Start: the run's clock starts
    watch = _Faults(ctx.Event(), ctx.Value("i", 0), ctx.Value("d", 0.0))  # the collector's stop and beat; the
    # workers that ended
    own: list[procs.Child] = []
    clock = _Clock(_limits(limits, cfg), traffic_started, out)
    meter = CpuMeter().start()  # the rest of the machine's CPU beside this run (stats.interference)
    tmp = procs.run_temp_folder()
    try:  # from the temp folder on: a Ctrl-C while the first roles spawn still removes it and stops them
        addrs = Addresses.ipc(tmp)
        own.append(start_role(ctx, "collector", roles.collector_role, cfg, addrs.collector, slos, watch.stop_run,
                              watch.collector_beat, out_dir=cfg.out))
        own.append(start_role(ctx, "scheduler", roles.scheduler_role, cfg, addrs.scheduler, addrs.collector,
                              stream_ended, watch.workers_ended, out_dir=cfg.out))
        if pool is None:
            own += [start_role(ctx, f"worker-{i}", roles.worker_role, cfg, addrs.scheduler, addrs.collector,
                               f"worker-{i}", out_dir=cfg.out) for i in range(cfg.workers)]
            workers = []
        else:
            workers = pool.join(addrs, cfg.out)
        own.append(start_role(ctx, "traffic", roles.traffic_role, cfg, addrs.scheduler, traffic_started,
                              out_dir=cfg.out))
        write_text_atomic(RunDir(out).pids, json.dumps({c.name: c.proc.pid for c in own + workers}))  # never half
        _watch(own, workers, on_tick, stream_ended, clock, watch, cfg.liveness_s)
    finally:
        watch.stop_run.set()  # the collector's signal from here on is the launcher's: no run to stop
        beside = meter.stop(start_s=clock.t_started)  # from the first request to the run's end (its drain too)
        _stop(own, stalled=watch.collector_stalled(cfg.liveness_s))  # producers first, then the collector
        shutil.rmtree(tmp, ignore_errors=True)
    if not RunDir(out).summary.exists():
        raise RunFailed(f"the collector wrote no summary in {out}")
    post_process(out, watch.deaths, beside, cfg.strategy_code())
    return read_summary(out)


class _Clock:
    """A run's two phases and their limits; start-up and run times go into OUT/timing.json."""

    def __init__(self, limits: Limits, started_event, out: Path) -> None:
        self.limits, self.started_event, self.out = limits, started_event, out
        self.t_launch, self.t_started = time.monotonic(), None

    def elapsed_s(self) -> float:
        """Seconds since launch (what a status line shows)."""
        return time.monotonic() - self.t_launch

    def check(self, collector_silent: bool = False) -> None:
        """Note when the traffic started; raise RunTimeout past the limit of the current phase (its line
        names the collector when it gave no sign of life: `collector_silent`)."""
        t = time.monotonic()
        if self.t_started is None and self.started_event.is_set():
            self.t_started = t
            write_text_atomic(RunDir(self.out).timing, json.dumps({"startup_s": round(t - self.t_launch, 3)}))
        if self.t_started is None:
            if self.limits.startup_s and t - self.t_launch > self.limits.startup_s:
                who = ("the collector gave no sign of life (stopped or stalled)" if collector_silent
                       else "the workers were still loading or warming up")
                raise RunTimeout(f"start-up passed its limit of {self.limits.startup_s:g} s: {who} (no Start "
                                 "was sent to the traffic)", "startup")
        elif self.limits.run_s and t - self.t_started > self.limits.run_s:
            raise RunTimeout(f"stopped {self.limits.run_s:g} s after the first request (the run's limit); "
                             "what finished is kept, the rest failed", "run")


def _with_schedule(cfg: RunConfig, out: Path) -> RunConfig:
    """Build (or check) the schedule here, so a bad dataset fails before any process starts; the
    traffic process then replays the saved file."""
    from batchlab.traffic.run_schedule import make_schedule
    from batchlab.traffic.schedule import save_schedule

    path = RunDir(out).schedule
    save_schedule(make_schedule(cfg), path)
    return cfg.model_copy(update={"schedule": str(path)})


@dataclass(slots=True)
class _Faults:
    """What the watch saw go wrong: each role that ended before the run's end (outcome.death_line), the
    collector's request to stop the run (a signal reached it before the run's end), and how many
    workers ended (the scheduler stops waiting for those at start-up)."""

    stop_run: object  # a multiprocessing Event
    workers_ended: object  # a multiprocessing Value("i")
    collector_beat: object  # a multiprocessing Value("d"): time.monotonic() of the collector's last sign of life
    deaths: list[str] = field(default_factory=list)

    def collector_silent_s(self) -> float:
        """Seconds since the collector's last sign of life (0 before its first: start-up's limit covers that)."""
        beat = self.collector_beat.value
        return time.monotonic() - beat if beat else 0.0

    def collector_stalled(self, liveness_s: float) -> bool:
        """The collector gave no sign of life for the liveness window (stopped, or stalled): waiting for it
        to write is pointless."""
        return self.collector_silent_s() > liveness_s


def _watch(own: list[Child], workers: list[Child], on_tick, stream_ended, clock: _Clock, faults: _Faults,
           liveness_s: float) -> None:
    """Wait for the run's end. A dead collector or scheduler, or the last worker, stops the run; so does a
    collector silent for `liveness_s` (stopped or stalled: its wait has a bound, its final write included);
    a dead traffic process or one of several workers does not: the scheduler notices and the run goes on.
    Every one is noted in `faults`, with its exception when it crashed. A role ends with 0 only when
    the run is over (roles.py); any other code is a death, during start-up (before the traffic's
    Start) as later. Warm workers (`workers`, from a pool) outlive the run: its end is the scheduler's
    and collector's."""
    children, reported = own + workers, set()
    while True:
        raise_if_stopped()  # a Ctrl-C or SIGTERM whose exception a library swallowed stops the run all the same
        # the end is seen before the exit codes are read: a scheduler stopped while the run drains can end
        # within one poll of the collector (a loaded machine), and its death is still named
        ended = not any(c.proc.is_alive() for c in own if c.name in ("scheduler", "collector"))
        if faults.stop_run.is_set() and "collector" not in reported:
            reported.add("collector")
            faults.deaths.append("collector stopped by a signal mid-run: the run was stopped, what it had "
                                 "is written")
            raise RunFailed(faults.deaths[-1])
        for c in children:
            code = c.proc.exitcode
            if code in (None, 0) or c.name in reported:
                continue
            reported.add(c.name)
            message = outcome.death_line(c.name, code, started=clock.started_event.is_set(),
                                         cause=_crash_cause(clock.out, c.name))
            faults.deaths.append(message)
            if c.name.startswith("worker-"):
                with faults.workers_ended.get_lock():
                    faults.workers_ended.value += 1
            if _fatal(c, children):
                raise RunFailed(message)
            log.warning("%s; the run goes on", message)
            if c.name == "traffic":  # it may have died before its hello: tell the scheduler directly
                stream_ended.set()
        if ended:
            return
        if faults.collector_stalled(liveness_s) and "collector" not in reported:
            reported.add("collector")
            faults.deaths.append(f"collector stalled mid-run: no sign of life for {faults.collector_silent_s():.0f} s "
                                 f"(liveness_s {liveness_s:g}); the rows it wrote before are in the out folder's "
                                 "parts/")
            raise RunFailed(faults.deaths[-1])
        clock.check(collector_silent=not faults.collector_beat.value
                    or faults.collector_silent_s() > SILENT_AT_START_S)
        if on_tick is not None:
            on_tick(clock.elapsed_s(), {c.name: c.proc.is_alive() for c in children})
        _wait_for_an_end(children, POLL_S)


def _wait_for_an_end(children: list[Child], timeout_s: float) -> None:
    """Sleep until a live child ends, at most timeout_s: the run's end (its scheduler's and collector's exit) is
    seen at once, not up to a poll later (0.1 s a run on average, 12 runs in the smoke sweep)."""
    connection.wait([c.proc.sentinel for c in children if c.proc.is_alive()], timeout_s)


def _crash_cause(out: Path, name: str) -> str:
    """The exception a role's process ended with, as it wrote it ("" when it wrote none)."""
    try:
        return RunDir(out).crash(name).read_text().strip()
    except OSError:
        return ""


def _fatal(dead: Child, children: list[Child]) -> bool:
    if dead.name == "traffic":  # killed or stopped: the scheduler ends the stream; crashed: a bug to show
        return 0 < dead.proc.exitcode <= outcome.SIGNAL_EXIT_BASE
    if dead.name.startswith("worker-"):
        return not any(c.proc.is_alive() for c in children if c.name.startswith("worker-"))
    return True


def _stop(children: list[Child], stalled: bool = False) -> None:
    """Stop the producers first (traffic, then the scheduler, which tells the workers), then give the
    collector time to read what is queued and write before it is told to stop; reap every group. A
    `stalled` collector, or one stopped (SIGSTOP), is not waited for: it could not act on a signal."""
    order = {"traffic": 0, "scheduler": 1}
    producers = sorted((c for c in children if c.name != "collector"), key=lambda c: order.get(c.name, 2))
    collector = [c for c in children if c.name == "collector"]
    with sigint_ignored():  # a second Ctrl-C must not cut the clean-up short and leave processes behind
        for c in producers:
            procs.stop([c], signal.SIGTERM, STOP_GRACE_S)
        if stalled or any(procs.is_stopped(c) for c in collector):
            procs.reap(collector)
            return
        for c in collector:
            c.proc.join(timeout=COLLECTOR_GRACE_S)  # it ends by itself once RunEnd and the byes arrive
        procs.stop(collector, signal.SIGTERM, STOP_GRACE_S)
