"""Every strategy's capacity search for a sweep's plan: live (each probe an ordinary point folder, run by
cli.sweep_point.execute on the sweep's warm workers) or in virtual time (the simulator, no files).

Each search starts from a burst (probe_requests within probe_duration_s, no queue limit: finished ÷
window is what the worker does when saturated), then collector.capacity.search measures rates of
duration_s traffic each. Layout: OUT/_probe/strategy=<label>/ (the burst),
OUT/_capacity/strategy=<label>/rate=<r>/repeat=0/
(the probes), OUT/capacity.json (every strategy's bracket, estimate and probes with their verdicts).
"""
import json
from pathlib import Path

import pandas as pd

from batchlab.cli.sweep_plan import AutoRates, Entry, Plan, Point, SweepError
from batchlab.cli.sweep_point import execute, reused  # the sweep's one way to run a point, or reuse it
from batchlab.collector.capacity import Capacity, Probe, Verdict, search, sustain, tokens_per_request
from batchlab.collector.layout import CAPACITY_DIR, CAPACITY_FILE, PROBE_DIR, point_dir, probe_dir
from batchlab.collector.summary import Summary, read_summary
from batchlab.protocol.files import write_json_atomic

SEARCH_KEYS = {"probe_requests", "probe_duration_s", "search_duration_s", "width", "max_probes"}


def probe_of(rate: float, requests: pd.DataFrame, duration_s: float, slos: dict | None, folder: str = "") -> Probe:
    """One probe's verdict from its requests table."""
    return Probe(rate, sustain(requests, duration_s, slos), folder, tokens_per_request(requests))


def _burst_point(plan: Plan, entry: Entry, out: Path, s: AutoRates) -> tuple[Point, dict]:
    point = Point(entry, s.probe_requests / s.probe_duration_s, 0, plan.seed, out / PROBE_DIR / probe_dir(entry.label))
    return point, {**plan.base, "duration_s": s.probe_duration_s, "max_queue": 0, "max_queue_tokens": 0}


def _probe_point(plan: Plan, entry: Entry, out: Path, rate: float, s: AutoRates) -> tuple[Point, dict]:
    point = Point(entry, rate, 0, plan.seed, out / CAPACITY_DIR / point_dir(entry.label, rate, 0))
    return point, {**plan.base, "duration_s": s.search_duration_s}


class LiveSearch:
    """Capacity searches on real points, on the sweep's warm workers (cli.pool.PoolKeeper)."""

    def __init__(self, plan: Plan, out: Path, settings: AutoRates, pools=None, view=None) -> None:
        self.plan, self.out, self.s, self.pools, self.view = plan, out, settings, pools, view

    def _run(self, point: Point, base: dict, what: str) -> dict:
        tick = self.view.ticker(point, what) if self.view else None  # resume: a probe that measured what
        return reused(point, base, True, self.view) or execute(point, base, tick, self.plan.limits(), self.pools)

    def start_rate(self, entry: Entry) -> float:
        """The burst's finished ÷ window (req/s); SweepError when the burst itself failed."""
        point, base = _burst_point(self.plan, entry, self.out, self.s)
        record = self._run(point, base, "burst")
        if record["status"] not in ("done", "skipped"):
            raise SweepError(f"the capacity burst on {entry.label} failed: {record['reason'].splitlines()[0]}")
        rate = read_summary(point.folder).requests_per_s
        if not rate > 0:
            raise SweepError(f"the capacity burst on {entry.label} finished no request within the point's limit")
        return rate

    def measure(self, entry: Entry):
        """collector.capacity.Measure for this entry: one point of duration_s at the rate."""
        from batchlab.collector.parts import load_table

        def measure(rate: float) -> Probe:
            point, base = _probe_point(self.plan, entry, self.out, rate, self.s)
            record = self._run(point, base, "capacity")
            where = str(point.folder.relative_to(self.out))
            if record["status"] not in ("done", "skipped"):
                return Probe(rate, Verdict(False, [f"run failed: {record['reason'].splitlines()[0]}"], 0.0, 0.0), where)
            probe = probe_of(rate, load_table(point.folder, "requests"), self.s.search_duration_s,
                             point.config(base).slos() or None, where)
            if self.view:
                self.view.note(f"capacity {entry.label} λ={rate:g}: "
                               + ("sustained" if probe.verdict.sustained else "; ".join(probe.verdict.reasons)))
            return probe

        return measure


class SimulatedSearch:
    """The same searches in virtual time (simulator): nothing is written."""

    def __init__(self, plan: Plan, settings: AutoRates) -> None:
        self.plan, self.s = plan, settings

    def _requests(self, point: Point, base: dict) -> tuple[pd.DataFrame, Summary, dict | None]:
        from batchlab.simulator.run import simulate
        from batchlab.traffic.run_schedule import make_schedule

        cfg = point.config(base)
        tables = simulate(cfg, make_schedule(cfg))
        return tables.requests, tables.summary, cfg.slos() or None

    def start_rate(self, entry: Entry) -> float:
        """The burst's finished ÷ window in virtual time."""
        _, summary, _ = self._requests(*_burst_point(self.plan, entry, Path("."), self.s))
        if not summary.requests_per_s > 0:
            raise SweepError(f"the simulated capacity burst on {entry.label} finished no request")
        return summary.requests_per_s

    def measure(self, entry: Entry):
        """collector.capacity.Measure for this entry, in virtual time."""

        def measure(rate: float) -> Probe:
            requests, _, slos = self._requests(*_probe_point(self.plan, entry, Path("."), rate, self.s))
            return probe_of(rate, requests, self.s.search_duration_s, slos)

        return measure


def search_one(entry: Entry, runner, settings: AutoRates) -> Capacity:
    """One entry's search; a burst that failed or finished nothing leaves that entry unmeasured (with the
    reason), not the others."""
    try:
        start = runner.start_rate(entry)
    except SweepError as exc:
        return Capacity(entry.label, None, None, note=str(exc))
    return search(entry.label, start, runner.measure(entry), width=settings.width, max_probes=settings.max_probes)


def search_all(plan: Plan, runner, settings: AutoRates, labels: list[str] | None = None) -> dict[str, Capacity]:
    """Each entry's (or each labelled one's) capacity, in grid order."""
    return {e.label: search_one(e, runner, settings) for e in plan.entries if labels is None or e.label in labels}


def capacity_document(capacities: dict[str, Capacity], settings: AutoRates) -> dict:
    """capacity.json's content."""
    return {"search": settings.model_dump(include=SEARCH_KEYS), "strategies": {lb: c.as_dict() for lb, c in capacities.items()}}


def run_capacity(plan: Plan, out: Path, settings: AutoRates, pools=None, view=None,
                 labels: list[str] | None = None) -> dict:
    """Live searches into `out`; writes and returns OUT/capacity.json (kept on resume when its search
    settings are the same and it holds every strategy asked for)."""
    path = out / CAPACITY_FILE
    wanted = labels or [e.label for e in plan.entries]
    if path.exists():
        doc = json.loads(path.read_text())
        if (doc.get("search") == settings.model_dump(include=SEARCH_KEYS) and doc.get("plan_hash") == plan_hash(plan)
                and set(wanted) <= set(doc.get("strategies", {}))):
            return doc
    doc = capacity_document(search_all(plan, LiveSearch(plan, out, settings, pools, view), settings, labels),
                            settings) | {"plan_hash": plan_hash(plan)}
    write_json_atomic(path, doc, default=str)
    return doc


def plan_hash(plan: Plan) -> str:
    """What the searches measured: the base settings and every entry's (a changed setting searches again)."""
    import hashlib

    text = json.dumps({"base": plan.base, "entries": [[e.label, e.overrides] for e in plan.entries]},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
