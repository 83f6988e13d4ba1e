"""Every strategy's saturated rate μ and capacity search for a sweep's plan: live (each run an ordinary point
folder, run by lab.sweep_point.execute on the sweep's warm workers) or in virtual time (the simulator, no
files).

First the saturated runs (μ: stats.saturation; how many repeats: lab.saturated_repeats), then
lab.rate_search.search's probes from just below μ; docs/capacity.md gives both, the folders they write
(OUT/_saturated/, OUT/_capacity/) and capacity.json.
"""
import math
import time
from pathlib import Path

import pandas as pd

from batchlab.collector.layout import CAPACITY_DIR, SATURATED_DIR, point_dir, saturated_dir
from batchlab.collector.summary import SummaryError, read_summary
from batchlab.protocol.outcomes import MEASURED
from batchlab.lab.disturbance import Disturbances
from batchlab.lab.rate_search import search, start_below
from batchlab.lab.saturated_repeats import least_repeats, measured_runs, saturate_all
from batchlab.lab.sweep_plan import AutoRates, Entry, Plan, Point, SweepError
from batchlab.lab.sweep_point import execute, reused  # the sweep's one way to run a point, or reuse it
from batchlab.protocol.setting_groups import said
from batchlab.protocol.study_settings import CapacitySettings
from batchlab.protocol.verdicts import Sustain
from batchlab.stats.capacity import CapacityEstimate, Probe, tokens_per_request
from batchlab.stats.interference import read as read_interference
from batchlab.stats.saturation import (WINDOW, SaturatedRun, busy_run, choose_estimator, estimated, pooled,
                                       saturated_run, with_busy)
from batchlab.stats.verdict import WARMUP_SHARE as CAPACITY_WARMUP_SHARE
from batchlab.stats.verdict import Verdict, arrival_cv2, sustain

SEARCH_KEYS = set(CapacitySettings.model_fields)  # capacity.json's "search": what a resume must match
OPEN_LOOP_KEYS = ("rate", "arrival", "burstiness")  # a closed loop refuses them
# A saturated run's pool of requests for its clients to take (a closed loop's schedule, built and tokenized
# before it starts: the default 10,000 ShareGPT prompts cost seconds a run): this many per client, or this many
# a second of its traffic, whichever is more; a pool that runs dry ends the traffic, and μ's window with it
POOL_PER_CLIENT = 8
POOL_REQ_S = 200.0
EXTENSIONS = 2  # a saturated run whose steady window cannot bound μ runs again, twice as long, at most this
# many times (a worker slower than planned, or a loaded machine: 15 s held one batch, or two 0.19 s apart)


def probe_of(rate: float, requests: pd.DataFrame, duration_s: float, cfg, folder: str = "",
             saturated: dict | None = None) -> Probe:
    """One probe's verdict from its requests table, judged against μ (`saturated`: its upper bound the ceiling)
    under the probe's own SLOs and arrival process. With a queue limit or SLOs, the steady queue's level
    decides (rejections, waits), so μ's estimate also says how long the probe's queue needs to settle; without
    either, any rate below μ is sustained in the long run and the queue's trend and μ's bound decide."""
    ceiling, mu = (saturated["req_s_hi"], saturated["req_s"]) if saturated else (None, None)
    limited = bool(cfg.max_queue or cfg.max_queue_tokens or cfg.slos())
    verdict = sustain(requests, duration_s, cfg.slos() or None, ceiling, mu if limited else None,
                      arrival_cv2(cfg.arrival, cfg.burstiness))
    return Probe(rate, verdict, folder, tokens_per_request(requests))


def clients(plan: Plan, entry: Entry, s: AutoRates) -> int:
    """The saturated run's clients: saturated_clients, else 2 × the entry's batch cap × its workers."""
    if s.saturated_clients:
        return s.saturated_clients
    cfg = Point(entry, 1.0, 0, plan.seed, Path(".")).config(plan.base)
    return 2 * max(cfg.batch_size, cfg.max_batch_size, cfg.max_num_seqs) * cfg.workers


def _saturated_point(plan: Plan, entry: Entry, out: Path, repeat: int, s: AutoRates,
                     duration_s: float, pool_req_s: float = POOL_REQ_S) -> tuple[Point, dict]:
    n_clients = clients(plan, entry, s)
    point = Point(entry, float("inf"), repeat, plan.seed, out / SATURATED_DIR / saturated_dir(entry.label, repeat),
                  n_clients)
    base = {k: v for k, v in plan.base.items() if k not in OPEN_LOOP_KEYS}
    pool = max(POOL_PER_CLIENT * n_clients, math.ceil(pool_req_s * duration_s))
    return point, {**base, "duration_s": duration_s, "max_queue": 0, "max_queue_tokens": 0, "num_requests": pool}


def durations(s: AutoRates) -> list[float]:
    """A saturated run's traffic, s: saturated_duration_s, then each extension's (twice the one before)."""
    return [s.saturated_duration_s * 2**k for k in range(EXTENSIONS + 1)]


def extended(label: str, tries: list[float], once, view=None, own_interval: bool = True) -> SaturatedRun:
    """The first of `once(duration_s)` (a saturated run's μ) over `tries` that bounds μ by either estimator
    (SaturatedRun.bounded): a run whose steady window holds fewer than 2 completion events gives None, and one
    too short for two blocks an unbounded interval (a point estimate from one gap between two batches), unless
    its busy time bounds μ. Without `own_interval` (a study of 2 or more repeats: μ's interval is the repeats'
    spread, never one run's) any μ will do. The last try's μ when none bounds it; SweepError when the last gave
    none."""
    for k, duration_s in enumerate(tries):
        run = once(duration_s)
        if (run is not None and (run.bounded or not own_interval)) or k + 1 == len(tries):
            break
        if view is not None:
            why = "fewer than 2 completion events" if run is None else "too few completions for an interval of μ"
            view.note(f"saturated {label}: {why} in the steady window of {duration_s:g} s; running it again for "
                      f"{tries[k + 1]:g} s")
    if run is None:
        raise SweepError(f"the saturated run of {label} finished too few requests in its steady window, even over "
                         f"{tries[-1]:g} s (a longer {said('saturated_duration_s', schema=CapacitySettings)} may)")
    return run


WIDE_RATIO = 10.0  # a repeat's own interval wider than this (hi / lo) says nothing: shown as such, not as figures


def _own_interval(run: SaturatedRun) -> str:
    """A repeat's own interval of μ as its note shows it: "[lo, hi] ", or, when a few batch means in the steady
    window make it span more than WIDE_RATIO×, what it is (μ's interval then comes from the repeats' spread)."""
    if run.req_s_lo > 0 and run.req_s_hi / run.req_s_lo <= WIDE_RATIO:
        return f"[{run.req_s_lo:.3g}, {run.req_s_hi:.3g}] "
    return "(too few batches in this run for an interval of its own; the repeats' spread gives μ's) "


def _busy_text(run: SaturatedRun) -> str:
    """'; over the worker's busy time 3.9 [3.7, 4.1]' (the run's other estimate of μ), '' without one."""
    b = run.by("busy")
    if b is None:
        return ""
    own = f" [{b.req_s_lo:.3g}, {b.req_s_hi:.3g}]" if b.req_s_lo > 0 and b.req_s_hi / b.req_s_lo <= WIDE_RATIO else ""
    return f"; over the worker's busy time {b.req_s:.3g}{own}"


def measured(folder: Path, duration_s: float, repeat: int, where: str) -> SaturatedRun | None:
    """A saturated run folder's μ by both estimators: over its steady window, the busy time's beside it."""
    from batchlab.collector.parts import load_table

    requests = load_table(folder, "requests")
    steps = load_table(folder, "steps")
    busy = busy_run(requests, load_table(folder, "batches"), steps if len(steps) else None, duration_s,
                    repeat=repeat, folder=where)
    return with_busy(saturated_run(requests, duration_s, repeat=repeat, folder=where), busy)


def _interference(folder: Path) -> dict | None:
    """The other work beside a run (its summary's; None when it has none to read)."""
    try:
        return read_summary(folder).interference
    except SummaryError:
        return None


def _probe_point(plan: Plan, entry: Entry, out: Path, rate: float, s: AutoRates,
                 duration_s: float | None = None) -> tuple[Point, dict]:
    point = Point(entry, rate, 0, plan.seed, out / CAPACITY_DIR / point_dir(entry.label, rate, 0))
    return point, {**plan.base, "duration_s": duration_s or probe_duration_s(rate, s)}


def probe_duration_s(rate: float, s: AutoRates) -> float:
    """A probe's traffic: search_duration_s, or long enough for search_requests arrivals at `rate` after its
    warm-up quarter, the part its verdict judges (a queue's trend read from a dozen arrivals says nothing)."""
    return max(s.search_duration_s, s.search_requests / (rate * (1 - CAPACITY_WARMUP_SHARE)))


class LiveSearch:
    """Capacity searches on real points, on the sweep's warm workers (runner.pool.PoolKeeper); a run a burst
    of other work disturbed runs again (`disturbed`: the sweep's lab.disturbance.Disturbances)."""

    def __init__(self, plan: Plan, out: Path, settings: AutoRates, pools=None, view=None,
                 disturbed: Disturbances | None = None, progress=None) -> None:
        self.plan, self.out, self.s, self.pools, self.view = plan, out, settings, pools, view
        self.disturbed = disturbed or Disturbances.measured(plan.rerun_disturbed)
        self.progress = progress  # lab.progress.StudyProgress: the study's line (None: none)

    def _run(self, point: Point, base: dict, what: str, extension: bool = False) -> dict:
        tick = self.view.ticker(point, what) if self.view else None  # resume: a probe that measured what
        stale_note = None if extension else self.view  # an extension says why it runs the point again
        name = f"{what} {point.entry.label} " + (f"repeat {point.repeat}" if what == "saturated" else
                                                 f"λ={point.rate:g}")
        started = time.monotonic()
        record = reused(point, base, True, stale_note) or self.disturbed.run(
            name, lambda: execute(point, base, tick, self.plan.limits(), self.pools), self.view)
        if self.progress is not None:
            self.progress.ran(what, time.monotonic() - started, float(base.get("duration_s") or 0.0))
        return record

    def saturated(self, entry: Entry, repeat: int) -> SaturatedRun:
        """One saturated run's μ, extended while it finished too little; SweepError when it failed or even the
        longest finished too little. A resumed search starts from the extension the folder holds."""

        def once(duration_s: float) -> SaturatedRun | None:
            point, base = _saturated_point(self.plan, entry, self.out, repeat, self.s, duration_s)
            record = self._run(point, base, "saturated", extension=duration_s > self.s.saturated_duration_s)
            if record["status"] not in MEASURED:
                raise SweepError(f"the saturated run of {entry.label} failed: {record['reason'].splitlines()[0]}")
            run = measured(point.folder, duration_s, repeat, str(point.folder.relative_to(self.out)))
            if run is not None:
                run.interference = _interference(point.folder)
            return run

        tries = durations(self.s)
        done = [k for k, d in enumerate(tries)
                if reused(*_saturated_point(self.plan, entry, self.out, repeat, self.s, d), True)]
        run = extended(f"{entry.label} repeat {repeat}", tries[done[0] if done else 0:], once, self.view,
                       own_interval=least_repeats(self.plan, self.s) < 2)
        if self.view:
            beside = read_interference(run.interference)
            busy = f"; ⚠ {beside.text()}" if beside is not None and beside.disturbed else ""
            self.view.note(f"saturated {entry.label} repeat {repeat}: μ = {run.req_s:.3g} {_own_interval(run)}req/s"
                           f"{_busy_text(run)}{busy}")
        return run

    def measure(self, entry: Entry, saturated: dict | None = None, duration_s: float | None = None):
        """lab.rate_search.Measure for this entry: one point at the rate, of `duration_s` traffic (None: the
        search's probe_duration_s)."""
        from batchlab.collector.parts import load_table

        def measure(rate: float) -> Probe:
            point, base = _probe_point(self.plan, entry, self.out, rate, self.s, duration_s)
            record = self._run(point, base, "capacity")
            where = str(point.folder.relative_to(self.out))
            if record["status"] not in MEASURED:
                return Probe(rate, Verdict(False, [f"run failed: {record['reason'].splitlines()[0]}"], 0.0, 0.0), where)
            probe = probe_of(rate, load_table(point.folder, "requests"), base["duration_s"], point.config(base),
                             where, saturated)
            if self.view:
                self.view.note(f"capacity {entry.label} λ={rate:g}: "
                               + (Sustain.SUSTAINED if probe.verdict.sustained else "; ".join(probe.verdict.reasons)))
            return probe

        return measure


class SimulatedSearch:
    """The same searches in virtual time (simulator): nothing is written."""

    def __init__(self, plan: Plan, settings: AutoRates, pool_req_s: float = POOL_REQ_S) -> None:
        self.plan, self.s, self.pool_req_s = plan, settings, pool_req_s

    def _tables(self, point: Point, base: dict):
        """The simulated run's tables (collector.tables.Tables) and its config."""
        from batchlab.simulator.run import simulate
        from batchlab.traffic.run_schedule import make_schedule

        cfg = point.config(base)
        return simulate(cfg, make_schedule(cfg)), cfg

    def _requests(self, point: Point, base: dict):
        """The simulated run's requests table (no other table is built) and its config."""
        from batchlab.simulator.run import simulate_requests
        from batchlab.traffic.run_schedule import make_schedule

        cfg = point.config(base)
        return simulate_requests(cfg, make_schedule(cfg)), cfg

    def saturated(self, entry: Entry, repeat: int) -> SaturatedRun:
        """One saturated run's μ in virtual time, extended as a live one is."""

        def once(duration_s: float) -> SaturatedRun | None:
            point, base = _saturated_point(self.plan, entry, Path("."), repeat, self.s, duration_s, self.pool_req_s)
            tables = self._tables(point, base)[0]
            steps = tables.steps if tables.steps is not None and len(tables.steps) else None
            busy = busy_run(tables.requests, tables.batches, steps,
                            duration_s, repeat=repeat)
            return with_busy(saturated_run(tables.requests, duration_s, repeat=repeat), busy)

        return extended(f"{entry.label} (simulated)", durations(self.s), once,
                        own_interval=least_repeats(self.plan, self.s) < 2)

    def probe_s(self, entry: Entry, rate: float, saturated: dict | None) -> float:
        """A probe's traffic at `rate`: the search's probe_duration_s (lab.twin's search makes it longer)."""
        return probe_duration_s(rate, self.s)

    def measure(self, entry: Entry, saturated: dict | None = None):
        """lab.rate_search.Measure for this entry, in virtual time."""

        def measure(rate: float) -> Probe:
            point, base = _probe_point(self.plan, entry, Path("."), rate, self.s, self.probe_s(entry, rate, saturated))
            requests, cfg = self._requests(point, base)
            return probe_of(rate, requests, base["duration_s"], cfg, saturated=saturated)

        return measure


def search_one(entry: Entry, runner, settings: AutoRates, runs: list[SaturatedRun] | str,
               estimator: str = WINDOW) -> CapacityEstimate:
    """One entry's search from its saturated runs (as `estimator` reads μ); a saturated run that failed
    leaves that entry unmeasured (with the reason), not the others."""
    if isinstance(runs, str) or not runs:
        note = runs if isinstance(runs, str) else "no saturated run"
        return CapacityEstimate(entry.label, None, None, note=note)
    saturated = pooled(estimated(runs, estimator) or runs, estimator if estimated(runs, estimator) else WINDOW)
    return search(entry.label, start_below(saturated, settings.width), runner.measure(entry, saturated),
                  width=settings.width, max_probes=settings.max_probes, saturated=saturated)


def search_all(plan: Plan, runner, settings: AutoRates, labels: list[str] | None = None,
               view=None) -> dict[str, CapacityEstimate]:
    """Each entry's (or each labelled one's) μ and capacity, in grid order."""
    entries = [e for e in plan.entries if labels is None or e.label in labels]
    runs = saturate_all(plan, runner, entries, settings, view)
    estimator = choose_estimator(measured_runs(runs))
    return {e.label: search_one(e, runner, settings, runs[e.label], estimator) for e in entries}


def capacity_document(capacities: dict[str, CapacityEstimate], settings: AutoRates) -> dict:
    """capacity.json's content."""
    return {"search": settings.model_dump(include=SEARCH_KEYS),
            "strategies": {lb: c.as_dict() for lb, c in capacities.items()}}
