"""How many saturated repeats a study runs, and what they decided: every strategy's saturated runs interleaved
within a repeat (serpentine order), at least the least repeats, then one more at a time of the baseline and the
strategies whose throughput comparison is still undecided (docs/capacity.md, "Repeats that stop when the answer
is decided"); capacity.json's `saturation` record and the terminal's lines. Each run is the runner's
(lab.capacity_search.LiveSearch or SimulatedSearch)."""
from batchlab.lab.sweep_plan import AutoRates, Entry, Plan, SweepError
from batchlab.report.headline import BASELINE
from batchlab.stats.intervals import PairedResult, between_repeats
from batchlab.stats.saturation import SaturatedRun, choose_estimator, estimated


def serpentine(entries: list[Entry], repeat: int) -> list[Entry]:
    """A repeat's order of the saturated runs: the grid's, reversed in every other repeat, so that a drift of
    the machine's speed falls on both sides of each comparison alike (benchmarks/throughput_power.py)."""
    return entries[::-1] if repeat % 2 else entries


def saturate_all(plan: Plan, runner, entries: list[Entry], settings: AutoRates,
                 view=None) -> dict[str, list[SaturatedRun] | str]:
    """label → its saturated runs, one per repeat (strategies interleaved within a repeat, in serpentine
    order), or why none: at least saturated_min_repeats (or the grid's repeats, when more), then one more
    repeat at a time, of the baseline and the strategies whose throughput comparison is still undecided
    (`decided`), until none is or saturated_repeats ran."""
    runs: dict[str, list[SaturatedRun] | str] = {e.label: [] for e in entries}
    most, least = max(plan.repeats, settings.saturated_repeats), least_repeats(plan, settings)
    progress = getattr(runner, "progress", None)
    todo = list(entries)
    for repeat in range(most):
        if progress is not None and repeat >= least:  # one more repeat than planned
            progress.plan("saturated", [settings.saturated_duration_s] * len(todo))
        for entry in serpentine(todo, repeat):
            if isinstance(runs[entry.label], str):
                continue
            try:
                runs[entry.label].append(runner.saturated(entry, repeat))
            except SweepError as exc:
                runs[entry.label] = str(exc)  # this strategy stays unmeasured, not the others
        if repeat + 1 >= least and repeat + 1 < most:
            found = comparisons(runs)
            open_ = [lb for lb, r in found.items() if not decided(r, settings.decided_pct)]
            if not open_:
                break
            todo = [e for e in entries if e.label in (BASELINE, *open_)]
            if view is not None:
                view.note(f"saturated: after {repeat + 1} repeats, throughput against {BASELINE} still undecided "
                          f"for {', '.join(open_)}; one more repeat of {', '.join(e.label for e in todo)}")
    return runs


def least_repeats(plan: Plan, settings: AutoRates) -> int:
    """The saturated repeats a study runs at least: saturated_min_repeats or the grid's repeats, whichever is
    more, never more than the most (saturated_repeats, or the grid's)."""
    most = max(plan.repeats, settings.saturated_repeats)
    return min(most, max(plan.repeats, settings.saturated_min_repeats))


def measured_runs(runs: dict[str, list[SaturatedRun] | str]) -> dict[str, list[SaturatedRun]]:
    """The strategies that have saturated runs, and those runs."""
    return {lb: rs for lb, rs in runs.items() if not isinstance(rs, str) and rs}


def comparisons(runs: dict[str, list[SaturatedRun] | str], upto: int | None = None) -> dict[str, PairedResult | None]:
    """Each strategy's saturated μ against the baseline's (report.headline.BASELINE), paired by repeat, as the
    headline states it, with the estimator the study would choose now; `upto`: over the first `upto` repeats.
    {} without a baseline."""
    found = measured_runs(runs)
    if upto is not None:
        found = {lb: [r for r in rs if r.repeat < upto] for lb, rs in found.items()}
    if BASELINE not in found:
        return {}
    estimator = choose_estimator(found)
    rates = {lb: {r.repeat: r.req_s for r in estimated(rs, estimator)} for lb, rs in found.items()}
    base = rates.pop(BASELINE)
    return {lb: between_repeats([mine[k] / base[k] for k in sorted(mine.keys() & base.keys())])
            if mine.keys() & base.keys() else None for lb, mine in rates.items()}


def decided(result: PairedResult | None, within_pct: float) -> bool:
    """Whether a throughput comparison needs no more repeats: its interval excludes zero, or lies within
    ±within_pct (no difference that matters)."""
    if result is None or not result.measured:
        return False
    return result.significant or (result.lo >= -within_pct and result.hi <= within_pct)


def saturation_record(runs: dict[str, list[SaturatedRun] | str], settings: AutoRates) -> dict:
    """capacity.json's `saturation`: the estimator chosen, the repeats run, and per comparison its change,
    interval and how many repeats it needed to be decided (None: not decided)."""
    found = measured_runs(runs)
    repeats = max((len(rs) for rs in found.values()), default=0)
    final = comparisons(runs)
    entry = {"estimator": choose_estimator(found), "repeats": repeats, "decided_pct": settings.decided_pct,
             "runs": {lb: len(rs) for lb, rs in found.items()}, "comparisons": {}}
    for label, result in final.items():
        needed = next((k for k in range(2, repeats + 1) if decided(comparisons(runs, k).get(label),
                                                                   settings.decided_pct)), None)
        entry["comparisons"][label] = {
            "change_pct": None if result is None else result.estimate,
            "lo_pct": None if result is None or not result.measured else result.lo,
            "hi_pct": None if result is None or not result.measured else result.hi,
            "decided": decided(result, settings.decided_pct), "repeats_needed": needed}
    return entry


def saturation_lines(record: dict) -> list[str]:
    """What the terminal says of the saturated phase: the estimator, and each comparison's repeats."""
    lines = [f"saturated: μ {'over the worker busy time' if record['estimator'] == 'busy' else 'over each run window'}"
             f" (the tighter of the two), {record['repeats']} repeats"]
    for label, c in record["comparisons"].items():
        how = (f"decided after {c['repeats_needed']} repeats" if c["decided"] and c["repeats_needed"] else
               f"not decided in {record['repeats']} repeats")
        change = "" if c["change_pct"] is None else f" {c['change_pct']:+.0f}%"
        interval = "" if c["lo_pct"] is None else f" [{c['lo_pct']:+.0f}%, {c['hi_pct']:+.0f}%]"
        lines.append(f"  throughput {label} vs {BASELINE}:{change}{interval}, {how}")
    return lines
