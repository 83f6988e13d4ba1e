"""Each strategy's capacity for the report: the searched capacities with their saturated rate μ (a sweep's
sweep.json `capacity` entry, or a `batchlab capacity` folder's capacity.json), else brackets derived from
the grid's own rates with the same sustain criterion (stats.capacity.from_runs); each checked against
what the same sweep's points completed at steady state; and the capacity table, in Markdown and as text."""
import json

from batchlab.collector.layout import CAPACITY_FILE
from batchlab.protocol.study_settings import TWIN_PROBE_MIN_S
from batchlab.protocol.verdicts import Agreement, Sustain
from batchlab.report.points import Collection
from batchlab.report.text import md_table
from batchlab.stats.capacity import from_runs
from batchlab.stats.saturation import saturated_run
from batchlab.stats.verdict import GOODPUT_MIN, GROWTH_SHARE, SERVED_MIN, Verdict, arrival_cv2, sustain

SEARCHED = "searched"  # a bracketing search measured it
FROM_GRID = "from the grid"  # the grid's fixed rates, judged with the same criterion


def load_capacities(collection: Collection, slos: dict | None = None) -> tuple[dict[str, dict], str]:
    """(label → capacity.json entry, how it was found); labels without a run are left out."""
    doc = collection.index.get("capacity")
    path = collection.root / CAPACITY_FILE
    if not doc and path.exists():
        doc = json.loads(path.read_text())
    runs = {lb: [(r.rate, r.requests, float(r.settings.get("duration_s") or 0.0)) for r in collection.runs
                 if r.label == lb] for lb in collection.labels()}
    if doc and doc.get("strategies"):
        found, source = {lb: dict(c) for lb, c in doc["strategies"].items()}, SEARCHED
    else:
        found, source = {lb: from_runs(lb, rs, slos).as_dict() for lb, rs in runs.items() if rs}, FROM_GRID
    for lb, c in found.items():
        verdicts = grid_verdicts([r for r in collection.runs if r.label == lb], slos, c.get("saturated"))
        c["grid_sustained"] = sustained_rates(verdicts)
        c["checks"] = checks(c, runs.get(lb, []), verdicts)
    return found, source


def grid_verdicts(runs: list, slos: dict | None = None, saturated: dict | None = None) -> dict[float, list[Verdict]]:
    """Each grid rate's sustain verdicts (one per repeat), judged as the capacity search judges its probes:
    the runs' SLOs, and with μ (`saturated`) its bound and, where a queue limit or SLOs make the queue's
    level count, how long the queue needs to settle."""
    verdicts: dict[float, list[Verdict]] = {}
    for run in runs:
        s, duration_s = run.settings, float(run.settings.get("duration_s") or 0.0)
        if not (run.rate and duration_s > 0 and len(run.requests)):
            continue
        limited = bool(s.get("max_queue") or s.get("max_queue_tokens") or slos or s.get("slo"))
        mu = saturated.get("req_s") if saturated and limited else None
        verdicts.setdefault(run.rate, []).append(sustain(
            run.requests, duration_s, slos, saturated.get("req_s_hi") if saturated else None, mu,
            arrival_cv2(str(s.get("arrival", "poisson")), float(s.get("burstiness") or 1.0))))
    return verdicts


def checks(c: dict, runs: list, verdicts: dict[float, list[Verdict]] | None = None) -> list[str]:
    """Where a capacity disagrees with what the same sweep measured, both ways: above its saturated rate μ's
    interval, or above the steady completion rate of a grid point it overloaded (completed clearly less than
    it was offered, at a rate `verdicts` found not sustained in a repeat: a short run whose queue lagged a burst
    completes less than it was offered too, and is undecided); below a grid rate the sweep sustained (served
    fully, queue flat, in every repeat); μ below what a grid point completed."""
    est, sat, lb = c.get("estimate_req_s") or c.get("lo_req_s"), c.get("saturated"), c.get("label", "")
    steady = [(rate, offered(requests, duration_s), run) for rate, requests, duration_s in runs
              if rate and duration_s > 0 and (run := saturated_run(requests, duration_s)) is not None]
    notes = below_sustained(c, verdicts or {})
    if est and sat and est > sat["req_s_hi"]:
        notes.append(f"{lb}: capacity {sig(est)} req/s is above its saturated rate μ = {mu_text(sat)}")
    # completing clearly less than was offered: the worker's own ceiling, what no capacity can exceed
    failed = {rate for rate, vs in (verdicts or {}).items() if any(v.failed for v in vs)}
    overloaded = [(rate, run) for rate, offer, run in steady
                  if run.req_s_hi < offer * (1 - GROWTH_SHARE) and rate in failed]
    if est and overloaded and est > (top := max(overloaded, key=lambda x: x[1].req_s_hi))[1].req_s_hi:
        notes.append(f"{lb}: capacity {sig(est)} req/s is above what it completed at steady state when overloaded "
                     f"(λ = {top[0]:g}: {sig(top[1].req_s)} [{sig(top[1].req_s_lo)}, {sig(top[1].req_s_hi)}] req/s)")
    if sat and steady and (fast := max(((r, run) for r, _, run in steady), key=lambda x: x[1].req_s_lo)
                           )[1].req_s_lo > sat["req_s_hi"]:
        notes.append(f"{lb}: at λ = {fast[0]:g} it completed {sig(fast[1].req_s)} req/s at steady state, above "
                     f"its saturated rate μ = {mu_text(sat)} (the machine's speed moved between them?)")
    return notes


def sustained_rates(verdicts: dict[float, list[Verdict]]) -> list[dict]:
    """The grid rates every repeat sustained, ascending: {"rate": nominal, "offered_req_s": the least any
    repeat offered} (capacities are in offered rates; a seeded schedule is some percent off its nominal)."""
    return [{"rate": rate, "offered_req_s": min(v.offered_req_s or rate for v in vs)}
            for rate, vs in sorted(verdicts.items()) if vs and all(v.sustained for v in vs)]


def contradicts(capacity_req_s: float | None, offered_req_s: float) -> bool:
    """Whether a rate a grid sustained (offered) lies clearly above a capacity: beyond the tolerance a
    sustained verdict itself allows (GROWTH_SHARE)."""
    return capacity_req_s is None or offered_req_s > capacity_req_s * (1 + GROWTH_SHARE)


def below_sustained(c: dict, verdicts: dict[float, list[Verdict]]) -> list[str]:
    """A capacity (its estimate, else the bound it has) below the offered rate of a grid point that every
    repeat sustained: the search said less than the sweep itself showed."""
    cap = c.get("estimate_req_s") or c.get("lo_req_s") or c.get("hi_req_s")
    held = [(rate, vs) for rate, vs in verdicts.items() if vs and all(v.sustained for v in vs)]
    if cap is None or not held:
        return []
    rate, vs = max(held, key=lambda item: min(v.offered_req_s or item[0] for v in item[1]))
    offered_req_s = min(v.offered_req_s or rate for v in vs)
    if not contradicts(cap, offered_req_s):
        return []
    served = min(v.served_share for v in vs)
    return [f"{c.get('label', '')}: capacity {bracket_text(c)} req/s is below λ = {rate:g} ({sig(offered_req_s)} "
            f"offered), which the same sweep sustained ({served:.0%} served, the queue flat, {len(vs)} repeat(s))"]


def offered(requests, duration_s: float) -> float:
    """Arrivals within the traffic ÷ its duration (req/s)."""
    arrivals = requests["arrival_time"]
    return float(((arrivals >= 0) & (arrivals <= duration_s)).sum() / duration_s)


def mu_text(sat: dict | None, unit: str = "req_s") -> str:
    """'4.6 [4.4, 4.8]' (μ and its 95% interval, '?' for a part missing) or 'not measured'."""
    if not sat:
        return "not measured"
    return f"{sig(sat.get(unit))} [{sig(sat.get(f'{unit}_lo'))}, {sig(sat.get(f'{unit}_hi'))}]"


def sig(value: float | None) -> str:
    """3 significant digits ('?' when missing)."""
    return "?" if value is None else f"{value:.3g}"


def bracket_text(c: dict, unit: str = "req_s") -> str:
    """'4.9 [4.6, 5.2]', '≥ 4.6 (no failing rate measured)' or '< 1.2 (no rate sustained)'."""
    lo, hi, est = c.get(f"lo_{unit}"), c.get(f"hi_{unit}"), c.get(f"estimate_{unit}")
    if lo is not None and hi is not None:
        return f"{sig(est)} [{sig(lo)}, {sig(hi)}]"
    if lo is not None:
        return f"≥ {sig(lo)} (no failing rate measured)"
    if hi is not None:
        return f"< {sig(hi)} (no rate sustained)"
    return f"not measured ({c['note']})" if c.get("note") and unit == "req_s" else "not measured"


def _probes_text(c: dict) -> str:
    return ", ".join(f"{p['rate_req_s']:g}{Sustain.of(p['sustained'], p.get('judged', True)).mark}"
                     for p in c.get("probes", []))


def capacity_rows(capacities: dict[str, dict]) -> list[tuple[str, str, str, str, str, str, str]]:
    """(strategy, capacity req/s, capacity tok/s, μ req/s, μ tok/s, probes, other work beside μ's runs) per
    strategy."""
    from batchlab.report.machine import cell, saturated_of

    beside = saturated_of(capacities)
    return [(lb, bracket_text(c), bracket_text(c, "tok_s"), mu_text(c.get("saturated")),
             mu_text(c.get("saturated"), "tok_s"), _probes_text(c), cell(beside.get(lb, [])))
            for lb, c in capacities.items()]


def _warnings(capacities: dict[str, dict]) -> list[str]:
    return [f"⚠ {note}" for c in capacities.values() for note in c.get("checks", []) + disagreement(c)]


def disagreement(c: dict) -> list[str]:
    """A live confirmation that disagrees with the capacity its twin found (judged not sustained there, or its E2E
    p50 outside what the twin predicts for its arrivals): both figures (lab.twin_confirm)."""
    confirm = c.get("confirmation") or {}
    if confirm.get("agrees") is not False:
        return []
    return [f"{c.get('label', '')}: the twin's capacity {bracket_text(c)} req/s, but the live probe disagrees: "
            f"{confirm.get('text', '')}; {confirm.get('twin_text', '')}".rstrip("; ")]


def confirmation_lines(capacities: dict[str, dict]) -> list[str]:
    """Per strategy found on a twin: the live probe at its capacity, and the twin on the same schedule."""
    return [f"{lb}: twin μ {sig(c['twin']['saturated']['req_s'])} req/s; live probe "
            f"{Agreement.of(c['confirmation'].get('agrees')).mark} {c['confirmation'].get('text', '')}"
            for lb, c in capacities.items() if c.get("twin") and c.get("confirmation")]


def capacity_table(capacities: dict[str, dict]) -> list[str]:
    """The Markdown table: capacity in req/s and output tok/s, estimate [interval], the saturated rate μ
    beside it, and the rates measured; then a warning for each disagreement with the sweep's own points."""
    head = ["strategy", "capacity (req/s)", "capacity (output tok/s)", "μ saturated (req/s)",
            "μ saturated (output tok/s)", "rates measured (✓ sustained, ✗ not, ? undecided)",
            "other work beside μ's runs (cores)"]
    warnings = _warnings(capacities)
    return md_table(head, capacity_rows(capacities)) + ([""] + [f"- {w}" for w in warnings] if warnings else [])


def capacity_text(capacities: dict[str, dict]) -> list[str]:
    """The same table as aligned plain text (the terminal): capacity and μ in req/s, μ in output tok/s."""
    rows = [("strategy", "capacity req/s", "μ saturated req/s", "μ output tok/s", "other work (cores)")]
    rows += [(r[0], r[1], r[3], r[4], r[6]) for r in capacity_rows(capacities)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return (["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
            + confirmation_lines(capacities) + _warnings(capacities))


def criterion_text(source: str) -> str:
    """How the capacities were found, in one paragraph."""
    how = ("a search per strategy from just below its saturated rate μ (geometric steps down while nothing is "
           "sustained, then bisection in log space), on the study's twin where one was fitted (virtual probes of "
           f"{TWIN_PROBE_MIN_S:.0f} s or more, the interval widened by how the live runs' speed against it "
           "varied, pooled over every strategy's runs; its estimate above μ only within μ's own interval; the "
           "one live probe at that capacity in the rates measured; section The twin)"
           if source == SEARCHED else "the sweep's own rates (no search "
           "ran: the bracket is as coarse as the grid, and μ was not measured)")
    return (f"μ = the completion rate of a saturated run (a closed loop with twice the batch cap in clients; "
            "warm-up and drain excluded), with a 95% interval from the spread between repeats, or from batch "
            f"means within one run. Capacity = the highest arrival rate sustained: served ≥ {SERVED_MIN:.0%} of "
            f"its requests, the waiting queue's trend (95% HAC interval) not above {GROWTH_SHARE:.0%} of the "
            f"offered rate, the offered rate not above μ's interval, and with SLOs goodput ≥ {GOODPUT_MIN:.0%}. "
            f"Found by {how}; shown as an estimate (never above μ on a live search) [the highest rate sustained "
            "less the queue growth its verdict could not exclude, the lowest rate not sustained or μ's upper "
            "bound]. Output tok/s = req/s × the mean output tokens per finished request (every strategy replays the "
            "same requests). A ⚠ line marks a capacity or μ that disagrees with what the sweep's own points "
            "completed.")
