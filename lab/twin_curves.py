"""The twin's dense curves and its error against the live points (docs/capacity.md, "The twin").

- `play_curves`: every strategy's twin (lab.twin) at `points` rates log-spaced from `low` × the lowest capacity
  to `high` × the highest, on the grid's seeded schedules (seed + repeat, as the live grid's), written as a
  simulated sweep in OUT/_twin/ (`batchlab report OUT/_twin` reads it; the study's report draws it as lines);
- `twin_errors`: each live grid point replayed on its strategy's twin with the very schedule the live run sent
  (its schedule.parquet), its TTFT p50, E2E p50 and output throughput against the live run's: OUT/_twin/errors.json,
  a row per point and per strategy the median and worst error, over every point and over those at ρ ≤ RHO_MAX
  (ρ = the rate ÷ the strategy's capacity).
"""
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from batchlab.protocol.outcomes import RunOutcome
from batchlab.collector.layout import TWIN_DIR
from batchlab.collector.layout import TWIN_ERRORS_FILE as ERRORS_FILE
from batchlab.lab.sweep_plan import Plan, span_rates
from batchlab.lab.twin import twin_plan
from batchlab.lab.twin_replay import replayed
from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.status import RequestStatus

RHO_MAX = 0.8  # the twin's error is summarised over the live points at or below this load, and over all
FIGURES = {"ttft_p50": "TTFT p50", "e2e_p50": "E2E p50", "throughput": "output throughput"}
CURVE_REPEATS = 2  # seeds per curve rate (seed, seed + 1: the live grid's first repeats' schedules)


def twin_presets(capacity: dict) -> dict[str, Path]:
    """label → its twin's preset, for every strategy capacity.json found one for."""
    return {lb: Path(c["twin"]["preset"]) for lb, c in capacity.get("strategies", {}).items() if c.get("twin")}


def curve_rates(capacity: dict, plan: Plan) -> list[float]:
    """The curves' rates: `points` log-spaced from low × the lowest capacity to high × the highest."""
    known = [c.get("estimate_req_s") or c.get("lo_req_s") or c.get("hi_req_s")
             for c in capacity.get("strategies", {}).values()]
    known = [v for v in known if v]
    return span_rates(known, plan.auto) if known and plan.auto else []


def play_curves(plan: Plan, out: Path, capacity: dict, view=None) -> Path | None:
    """Every twin's curve, a simulated sweep in OUT/_twin/ (None: no twin, or no capacity to span)."""
    from batchlab.lab.fanout import Fanout
    from batchlab.lab.simulate import SimPlan, run_simulation

    presets, rates = twin_presets(capacity), curve_rates(capacity, plan)
    if not presets or not rates:
        return None
    curves = replace(twin_plan(plan, presets), rates=rates, auto=None, repeats=CURVE_REPEATS, repeats_auto=None,
                     concurrency=[])
    folder = out / TWIN_DIR
    # a process per core: the grid's live runs wait for the curves (the smoke study's 96 simulated runs: 5.5 s in one
    # process, 3.5 s in two on the 2-core AMD EPYC VM)
    run_simulation(SimPlan(curves, folder, True, "twin of " + str(out)), fanout=Fanout(processes=0))
    if view is not None:
        view.note(f"twin: {len(presets)} strategies × {len(rates)} rates × {CURVE_REPEATS} seeds played in virtual "
                  f"time ({rates[0]:g} to {rates[-1]:g} req/s) → {folder}")
    return folder


def point_figures(requests, summary) -> dict[str, float]:
    """A run's figures the twin is judged on: TTFT p50, E2E p50 (s, finished requests) and output tok/s."""
    done = requests[requests["status"] == RequestStatus.FINISHED]
    return {"ttft_p50": float(np.median(done["ttft"])) if len(done) else math.nan,
            "e2e_p50": float(np.median(done["e2e"])) if len(done) else math.nan,
            "throughput": float(summary.throughput_tok_s or math.nan)}


def replay(folder: Path, preset: Path) -> dict[str, float]:
    """A live run folder's schedule played on a twin's preset, with the run's own settings: its figures."""
    tables, _ = replayed(folder, preset)
    return point_figures(tables.requests, tables.summary)


def live_figures(folder: Path) -> dict[str, float]:
    """A live run folder's figures."""
    from batchlab.collector.parts import load_table
    from batchlab.collector.summary import read_summary

    return point_figures(load_table(folder, "requests"), read_summary(folder))


def twin_errors(out: Path, index: dict, capacity: dict, view=None) -> dict | None:
    """Every live grid point of the sweep `index` (sweep.json) replayed on its twin; OUT/_twin/errors.json's
    content (None: no twin or no live point)."""
    presets = twin_presets(capacity)
    rows = []
    for point in index.get("points", []):
        label, folder = point.get("label"), out / str(point.get("dir", ""))
        if point.get("status") != RunOutcome.DONE or label not in presets or not (folder / "summary.json").exists():
            continue
        live, twin = live_figures(folder), replay(folder, presets[label])
        cap = capacity["strategies"][label].get("estimate_req_s")
        rows.append({"label": label, "rate": point["rate"], "repeat": point.get("repeat", 0), "dir": point["dir"],
                     "rho": point["rate"] / cap if cap else None, "live": live, "twin": twin,
                     "error": {k: (twin[k] / live[k] - 1) if live[k] and math.isfinite(live[k]) else None
                               for k in FIGURES}})
    if not rows:
        return None
    doc = {"rho_max": RHO_MAX, "points": rows, "strategies": summarise(rows)}
    write_json_atomic(out / TWIN_DIR / ERRORS_FILE, doc, default=str)
    if view is not None:
        for line in error_lines(doc):
            view.note(line)
    return doc


def summarise(rows: list[dict]) -> dict:
    """label → figure → {median, worst} of |error|, over the points at ρ ≤ RHO_MAX (`low`) and over all
    (`all`)."""
    out: dict = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        out[label] = {}
        for scope, chosen in (("low", [r for r in mine if r["rho"] is not None and r["rho"] <= RHO_MAX]),
                              ("all", mine)):
            out[label][scope] = {k: _stats([r["error"][k] for r in chosen]) for k in FIGURES}
    return out


def _stats(errors: list[float | None]) -> dict | None:
    values = np.abs([e for e in errors if e is not None and math.isfinite(e)])
    return {"median": float(np.median(values)), "worst": float(values.max()), "points": int(values.size)} \
        if values.size else None


def error_lines(doc: dict) -> list[str]:
    """The terminal's lines: per strategy, the twin's median / worst error at ρ ≤ RHO_MAX."""
    lines = [f"twin against the live points at ρ ≤ {doc['rho_max']:g} (|twin ÷ live − 1|, median / worst):"]
    for label, scopes in doc["strategies"].items():
        parts = [f"{name} {s['median']:.0%} / {s['worst']:.0%}" for k, name in FIGURES.items()
                 if (s := scopes["low"].get(k))]
        lines.append(f"  {label}: " + (", ".join(parts) if parts else "no live point at that load"))
    return lines
