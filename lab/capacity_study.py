"""A study's capacities, live: every strategy's saturated runs (μ, repeats until the throughput comparisons are
decided: lab.saturated_repeats.saturate_all), then each capacity searched on the study's twin and confirmed by one
live probe (lab.twin_confirm), or, with `twin: false`, searched by live probes alone. Writes OUT/capacity.json
(docs/capacity.md gives its fields)."""
import hashlib
import json
from dataclasses import asdict
from functools import partial
from pathlib import Path

from batchlab.collector.layout import CAPACITY_FILE
from batchlab.lab.capacity_search import SEARCH_KEYS, LiveSearch, search_one
from batchlab.lab.disturbance import Disturbances
from batchlab.lab.progress import StudyProgress
from batchlab.lab.saturated_repeats import saturate_all, saturation_lines, saturation_record
from batchlab.lab.sweep_plan import AutoRates, Entry, Plan
from batchlab.lab.twin import (TwinFit, fit_twin, held_to, pooled_spreads, speed_ranges, twin_capacity, widened,
                               with_speeds)
from batchlab.lab.twin_confirm import confirm, confirmation_rate
from batchlab.protocol.errors import CalibrateError
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.verdicts import Agreement
from batchlab.stats.capacity import CapacityEstimate
from batchlab.stats.saturation import estimated, pooled


def run_capacity(plan: Plan, out: Path, settings: AutoRates, pools=None, view=None,
                 labels: list[str] | None = None, disturbed: Disturbances | None = None,
                 progress: StudyProgress | None = None) -> dict:
    """Every strategy's (or each labelled one's) μ and capacity into `out`; writes and returns
    OUT/capacity.json (kept on resume when its search settings are the same and it holds every strategy asked
    for)."""
    path = out / CAPACITY_FILE
    wanted = labels or [e.label for e in plan.entries]
    if path.exists():
        doc = json.loads(path.read_text())
        if (doc.get("search") == settings.model_dump(include=SEARCH_KEYS) and doc.get("plan_hash") == plan_hash(plan)
                and set(wanted) <= set(doc.get("strategies", {}))):
            return doc
    entries = [e for e in plan.entries if e.label in wanted]
    if progress is None:
        progress = StudyProgress(view)
        plan_study(progress, plan, len(entries), grid=False)
    live = LiveSearch(plan, out, settings, pools, view, disturbed, progress)
    # 1. saturated runs, repeated until every throughput comparison is decided
    runs = saturate_all(plan, live, entries, settings, view)
    saturation = saturation_record(runs, settings)
    for line in saturation_lines(saturation) if view else []:
        view.note(line)
    # 2. each capacity: on the twin (every strategy's played first, side by side), confirmed live; or searched live
    entry_of = live_entry
    if settings.twin:
        twins = played_twins(plan, out, entries, runs, settings)
        entry_of = partial(twin_entry, twins=twins, ranges=speed_ranges(
            {label: t[2]["speed_ratios"] for label, t in twins.items() if not isinstance(t, CalibrateError)}))
    strategies = {e.label: entry_of(plan, out, live, e, runs[e.label], saturation["estimator"], settings, view)
                  for e in entries}
    # 3. every twin's interval, widened by how fast the machine ran against the twins in all the strategies' runs
    strategies = widen_twins(strategies, view)
    doc = {"search": settings.model_dump(include=SEARCH_KEYS), "method": "twin" if settings.twin else "live",
           "saturation": saturation, "strategies": strategies, "plan_hash": plan_hash(plan),
           "reran": live.disturbed.reran}
    write_json_atomic(path, doc, default=str)
    return doc


def plan_study(progress: StudyProgress, plan: Plan, entries: int, grid: bool = True) -> None:
    """The live runs a study with automatic rates will make, as far as known before it starts: its saturated
    runs (the least repeats), its capacity probes (with a twin: one confirmation each, at most confirm_max_s;
    else up to max_probes of search_duration_s) and, with `grid`, its live grid and the headline's repeats."""
    s = plan.auto
    least = max(plan.repeats, s.saturated_min_repeats)
    progress.plan("saturated", [s.saturated_duration_s] * (entries * least))
    probes = [s.confirm_max_s] * entries if s.twin else [s.search_duration_s] * (entries * s.max_probes)
    progress.plan("capacity", probes)
    if grid:
        rates = len(s.live_loads) if s.twin else s.points
        duration_s = float(plan.base.get("duration_s") or 0.0)
        progress.plan("run", [duration_s] * (entries * rates * plan.repeats))
        if plan.repeats_auto:
            more = plan.repeats_auto.max - plan.repeats
            progress.plan("repeat", [duration_s] * (entries * len(s.live_loads) * more))


def live_entry(plan: Plan, out: Path, live: LiveSearch, entry: Entry, runs, estimator: str, settings: AutoRates,
               view=None) -> dict:
    """One strategy's capacity searched by live probes (lab.rate_search.search)."""
    return search_one(entry, live, settings, runs, estimator).as_dict()


Played = tuple[TwinFit, CapacityEstimate, dict] | CalibrateError  # a twin's fit, capacity and record, or why none


def played_twins(plan: Plan, out: Path, entries: list[Entry], runs: dict, settings: AutoRates) -> dict[str, Played]:
    """label → its twin, fitted and searched in virtual time, side by side in a process per core (lab.fanout; one
    core: in this process), the longest searches first: each search is a bisection, one probe after another, and on
    the 2-core AMD EPYC VM the smoke study's took 2, 3 and 8 s one after another; before the first live
    confirmation, so no live run shares the CPU with them."""
    from batchlab.lab.fanout import Fanout

    items = [(e.label, runs[e.label]) for e in longest_first(plan, entries)
             if runs[e.label] and not isinstance(runs[e.label], str)]
    played = Fanout(processes=0).map(_played_twin, items, (plan, out, settings))
    return {label: twin for (label, _), twin in zip(items, played)}


def longest_first(plan: Plan, entries: list[Entry]) -> list[Entry]:
    """The entries whose twin plays every step as an event (a continuous worker's: the smoke study's continuous
    search took 8 s) before those that play a static batch as one (2 and 3 s), each group in the plan's order: a
    process free early takes the next search, so the longest must not start last."""
    from batchlab.lab.sweep_plan import Point
    from batchlab.scheduler.strategies import resolve

    def stepped(entry: Entry) -> bool:
        return resolve(Point(entry, 1.0, 0, plan.seed, Path(".")).config(plan.base)).mode == BatchingMode.CONTINUOUS

    return sorted(entries, key=lambda e: not stepped(e))


def _played_twin(shared: tuple[Plan, Path, AutoRates], item: tuple[str, list]) -> Played:
    """One strategy's twin (Fanout's function: module level)."""
    plan, out, settings = shared
    label, runs = item
    try:
        fit = fit_twin(out, label, runs)
        return fit, *twin_capacity(plan, fit, settings)
    except CalibrateError as exc:
        return exc


def twin_entry(plan: Plan, out: Path, live: LiveSearch, entry: Entry, runs, estimator: str, settings: AutoRates,
               view=None, twins: dict[str, Played] | None = None,
               ranges: dict[str, tuple[float, float]] | None = None) -> dict:
    """One strategy's capacity on its twin (played_twins' in `twins`, else played here), with the live confirmation
    beside it (`confirmation`), its prediction over the range one run's speed falls in (`ranges`, lab.twin's
    speed_ranges over every twin's runs; else its own runs'); the live search instead, said, when its runs cannot
    give a twin."""
    if isinstance(runs, str) or not runs:
        note = runs if isinstance(runs, str) else "no saturated run"
        return CapacityEstimate(entry.label, None, None, note=note).as_dict()
    read = estimated(runs, estimator)
    saturated = pooled(read, estimator) if read else pooled(runs)
    played = (twins or {}).get(entry.label) or _played_twin((plan, out, settings), (entry.label, runs))
    if isinstance(played, CalibrateError):
        if view:
            view.note(f"twin {entry.label}: {played}; its capacity is searched live instead")
        return live_entry(plan, out, live, entry, runs, estimator, settings) | {"twin_failed": str(played)}
    fit, cap, twin = played
    cap, held = held_to(cap, saturated)
    doc = cap.as_dict() | {"saturated": saturated, "twin": twin, "probes": [], "method": "twin",
                           **({"held_to_live_mu": True} if held else {})}
    rate = confirmation_rate(doc)
    if rate is not None:
        speeds = (ranges or speed_ranges({entry.label: twin["speed_ratios"]})).get(entry.label)
        check = confirm(live, entry, rate, saturated, settings, fit.preset, twin["saturated"], speeds)
        doc["confirmation"] = check.as_dict()
        doc["probes"] = [{"rate_req_s": check.probe.rate_req_s, "folder": check.probe.folder,
                          "tokens_per_request": check.probe.tokens_per_request, "live": True,
                          **asdict(check.probe.verdict)}]
        # the probe is one more sample of the machine's speed against the twin, at the load the capacity is about
        # (after its prediction, made from the saturated runs' alone)
        if check.speed is not None:
            twin.update(with_speeds(twin["speed_ratios"] + [check.speed]), confirmation_speed=check.speed)
        if view:
            agreement = Agreement.of(check.agrees).said
            view.note(f"confirm {entry.label}: {check.text()} ({agreement} with the twin); {check.twin_text()}")
    return doc


def widen_twins(strategies: dict[str, dict], view=None) -> dict[str, dict]:
    """The strategies' capacity entries, each twin's interval widened by its speed spread pooled over every
    twin's live runs (lab.twin.pooled_spreads), with the terminal's line per twin; the live searches' as they were."""
    twins = {label: doc["twin"] for label, doc in strategies.items() if doc.get("method") == "twin"}
    pooled_spreads(twins)
    out = dict(strategies)
    for label, twin in twins.items():
        saturated = out[label]["saturated"]
        out[label] = doc = widened(out[label], twin["spread_pct"], saturated.get("req_s_hi"))
        if view:
            view.note(twin_line(label, doc))
    return out


def twin_line(label: str, doc: dict) -> str:
    """The terminal's line for a twin's capacity: its μ beside the live one, the capacity and its interval, the
    spread that widened it, and a ⚠ with both figures when the live runs held it."""
    twin, saturated = doc["twin"], doc["saturated"]
    spread = ""
    if twin.get("spread_pct") is not None:
        own = f", its own {twin['own_spread_pct']:.1f}%" if twin.get("own_spread_pct") is not None else ""
        spread = (f" ± {twin['spread_pct']:.1f}% (live ÷ twin on each of {len(twin['speed_ratios'])} live runs' own "
                  f"steps: {twin['bias_pct']:+.1f}%; spread pooled over every twin's runs{own})")
    held = ""
    if doc.get("held_to_live_mu"):
        estimate = _num(twin["search"]["estimate_req_s"])
        held = (f" ⚠ held to the live μ: the twin's estimate {estimate} req/s is above "
                f"the live μ's interval [{_num(saturated.get('req_s_lo'))}, {_num(saturated.get('req_s_hi'))}]")
    return (f"twin {label}: μ {twin['saturated']['req_s']:.3g} req/s (live {saturated['req_s']:.3g}), capacity "
            f"{_num(doc['estimate_req_s'])} [{_num(doc['lo_req_s'])}, {_num(doc['hi_req_s'])}] req/s{spread}{held}")


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:.3g}"


def plan_hash(plan: Plan) -> str:
    """What the searches measured: the base settings, every entry's and the repeats (a change searches again)."""
    text = json.dumps({"base": plan.base, "entries": [[e.label, e.overrides] for e in plan.entries],
                       "repeats": plan.repeats}, sort_keys=True, default=str)  # a saturated run per repeat
    return hashlib.sha256(text.encode()).hexdigest()[:16]
