"""The twin's dense curves and its error against the live points (docs/capacity.md, "The twin").

- `play_curves`: every strategy's twin (lab.twin) at `points` rates log-spaced from `low` × the lowest capacity
  to `high` × the highest, on the grid's seeded schedules (seed + repeat, as the live grid's), written as a
  simulated sweep in OUT/_twin/ (`batchlab report OUT/_twin` reads it; the study's report draws it as lines);
- `twin_errors`: each live grid point replayed on its strategy's twin with the very schedule the live run sent
  (its schedule.parquet), its TTFT p50, E2E p50 and output throughput against the live run's: OUT/_twin/errors.json,
  a row per point and per strategy the median and worst error, over every point and over those at ρ ≤ RHO_MAX
  (ρ = the rate ÷ the strategy's capacity). Twice: as the twin predicts each run (its mean speed), and the model's
  own error: each run replayed at the speed its machine ran that minute (lab.twin.run_speed, the spread the
  twin's capacity interval already holds), each rate's repeats pooled. An 8 s point at ρ 0.8 holds some 20
  requests; a machine 10% slower that minute moves its TTFT p50 by a third, and which requests a static batch
  takes by a step's jitter: make run's per-run errors swing ±40% about a pooled error of a few percent.
"""
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from batchlab.protocol.outcomes import RunOutcome
from batchlab.collector.layout import TWIN_DIR
from batchlab.collector.layout import TWIN_ERRORS_FILE as ERRORS_FILE
from batchlab.collector.layout import TWIN_FIGURES as FIGURES
from batchlab.lab.sweep_plan import Plan
from batchlab.lab.sweep_order import span_rates
from batchlab.lab.twin import twin_plan
from batchlab.lab.twin_replay import replayed
from batchlab.protocol.files import write_json_atomic
from batchlab.stats.metrics import finished_p50

RHO_MAX = 0.8  # the twin's error is summarised over the live points at or below this load, and over all
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
    return {**finished_p50(requests), "throughput": float(summary.throughput_tok_s or math.nan)}


def _played(folder: Path, preset: Path):
    """(the requests table, the figures) of a live run folder's schedule played on `preset`, with the run's own
    settings."""
    tables, _ = replayed(folder, preset)
    return tables.requests, point_figures(tables.requests, tables.summary)


def _live(folder: Path):
    """(the requests table, the figures) of a live run folder."""
    from batchlab.collector.parts import load_table
    from batchlab.collector.summary import read_summary

    requests = load_table(folder, "requests")
    return requests, point_figures(requests, read_summary(folder))


def errors_of(live: dict[str, float], twin: dict[str, float]) -> dict[str, float | None]:
    """twin ÷ live − 1 per figure (None where the live figure is missing or zero)."""
    return {k: (twin[k] / live[k] - 1) if live[k] and math.isfinite(live[k]) else None for k in FIGURES}


def twin_errors(out: Path, index: dict, capacity: dict, view=None) -> dict | None:
    """Every live grid point of the sweep `index` (sweep.json) replayed on its twin, as the twin predicts it and
    at the speed the run's machine ran (lab.twin.run_speed), and each rate's repeats pooled; OUT/_twin/errors.json's
    content (None: no twin or no live point)."""
    import tempfile

    from batchlab.lab.twin import at_speed, run_speed
    from batchlab.worker.stepmodel import load_preset

    presets = twin_presets(capacity)
    models = {label: load_preset(path) for label, path in presets.items()}
    rows, played = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for point in index.get("points", []):
            label, folder = point.get("label"), out / str(point.get("dir", ""))
            if point.get("status") != RunOutcome.DONE or label not in presets or not (folder / "summary.json").exists():
                continue
            (live_requests, live), (_, twin) = _live(folder), _played(folder, presets[label])
            speed = run_speed(models[label], folder)
            requests, levelled = (_played(folder, at_speed(models[label], speed, Path(tmp) / "at_speed.yaml"))
                                  if speed else (None, None))
            cap = capacity["strategies"][label].get("estimate_req_s")
            rows.append({"label": label, "rate": point["rate"], "repeat": point.get("repeat", 0), "dir": point["dir"],
                         "rho": point["rate"] / cap if cap else None, "live": live, "twin": twin,
                         "error": errors_of(live, twin), "speed": speed, "at_speed": levelled,
                         "error_at_speed": errors_of(live, levelled) if levelled else None})
            if requests is not None:
                played.setdefault((label, point["rate"]), []).append((live_requests, requests, rows[-1]))
    if not rows:
        return None
    rates = [pooled_rate(label, rate, runs) for (label, rate), runs in played.items()]
    doc = {"rho_max": RHO_MAX, "points": rows, "rates": rates, "strategies": summarise(rows, rates),
           "repeats": speeds_by_repeat(rows)}
    (out / TWIN_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / TWIN_DIR / ERRORS_FILE, doc, default=str)
    if view is not None:
        for line in error_lines(doc):
            view.note(line)
    return doc


def speeds_by_repeat(rows: list[dict]) -> list[dict]:
    """Per repeat of the live grid (in order): each strategy's speed against its twin (its first rate's run) and
    their geometric mean; the machine's drift over the minutes between repeats, which the twin's prediction of
    each run cannot know (make run's quiet run on 2604060: 0.80, 0.89, 1.03, 1.10)."""
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["speed"]:
            out.setdefault(row["repeat"], {}).setdefault(row["label"], row["speed"])
    return [{"repeat": repeat, "speeds": speeds,
             "mean": float(np.exp(np.mean(np.log(list(speeds.values())))))} for repeat, speeds in sorted(out.items())]


def pooled_rate(label: str, rate: float, runs: list) -> dict:
    """One live rate's repeats pooled, each replayed at its own speed: TTFT and E2E p50 over every finished request
    of the repeats, live and twin; throughput the repeats' mean; ρ the first repeat's."""
    import pandas as pd

    def figures(tables: list, key: str) -> dict[str, float]:
        return {**finished_p50(pd.concat(tables)), "throughput": float(np.mean([row[key]["throughput"]
                                                                               for _, _, row in runs]))}

    live, twin = figures([r[0] for r in runs], "live"), figures([r[1] for r in runs], "at_speed")
    return {"label": label, "rate": rate, "repeats": len(runs), "rho": runs[0][2]["rho"], "live": live,
            "twin": twin, "error": errors_of(live, twin)}


def summarise(rows: list[dict], rates: list[dict] | None = None) -> dict:
    """label → figure → {median, worst} of |error|, over the points at ρ ≤ RHO_MAX (`low`) and over all (`all`),
    as the twin predicts each run; and (`model`: `low`, `all`) over the rates, each run at its own speed and each
    rate's repeats pooled."""
    out: dict = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        out[label] = _scopes([r for r in rows if r["label"] == label])
        mine = [r for r in rates or [] if r["label"] == label]
        if mine:
            out[label]["model"] = _scopes(mine)
    return out


def _scopes(rows: list[dict]) -> dict:
    low = [r for r in rows if r["rho"] is not None and r["rho"] <= RHO_MAX]
    return {scope: {k: _stats([r["error"][k] for r in chosen]) for k in FIGURES}
            for scope, chosen in (("low", low), ("all", rows))}


def _stats(errors: list[float | None]) -> dict | None:
    values = np.abs([e for e in errors if e is not None and math.isfinite(e)])
    return {"median": float(np.median(values)), "worst": float(values.max()), "points": int(values.size)} \
        if values.size else None


def error_lines(doc: dict) -> list[str]:
    """The terminal's lines: per strategy, the twin's median / worst error at ρ ≤ RHO_MAX, at the runs' own speed
    with each rate's repeats pooled (the model's error), and as it predicts each run."""
    lines = [f"twin against the live points at ρ ≤ {doc['rho_max']:g} (|twin ÷ live − 1|, median / worst; "
             f"at each run's own speed, repeats pooled per rate · as the twin predicts each run):"]
    for label, scopes in doc["strategies"].items():
        model = (scopes.get("model") or {}).get("low") or {}
        parts = [f"{name} {_pair_text(model.get(k))} · {_pair_text(scopes['low'].get(k))}"
                 for k, name in FIGURES.items() if scopes["low"].get(k) or model.get(k)]
        lines.append(f"  {label}: " + (", ".join(parts) if parts else "no live point at that load"))
    if len(doc.get("repeats") or []) > 1:
        lines.append("machine speed against the twins by repeat (geometric mean over the strategies): "
                     + ", ".join(f"{r['repeat']}: {r['mean']:.2f}" for r in doc["repeats"]))
    return lines


def _pair_text(s: dict | None) -> str:
    return f"{s['median']:.0%} / {s['worst']:.0%}" if s else "—"
