"""The study's twin in the report (docs/capacity.md, "The twin"): its curves drawn as lines with the live points
and their intervals on top (twin_curves.png), and a section stating what it is, how it agreed with the live
confirmation at each capacity, and its error against every live grid point (OUT/_twin/errors.json).
Only reads: the twin's files are lab.twin's and lab.twin_curves'."""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.collector.layout import INDEX_FILE, TWIN_DIR, TWIN_ERRORS_FILE as ERRORS_FILE, TWIN_FIGURES as FIGURES
from batchlab.collector.parts import load_table
from batchlab.protocol.errors import ReportError
from batchlab.protocol.outcomes import MEASURED
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.verdicts import Agreement
from batchlab.report.inputs import inside, read_index
from batchlab.report.points import index_load
from batchlab.report.stats import GroupStats
from batchlab.report.text import md_table
from batchlab.stats.metrics import finished_p50, request_metrics

PLOT_FILE = "twin_curves.png"


CURVE_COLUMNS = ["status", "arrival_time", "scheduled_time", "first_token_time", "completion_time", "output_len"]


@dataclass(slots=True, frozen=True)
class CurvePoint:
    """One rate of a twin's curve: TTFT and E2E p50 (s) over its seeds' finished requests."""

    label: str
    rate: float
    p50: dict[str, float]  # stats.metrics.finished_p50's: ttft_p50, e2e_p50


@dataclass(slots=True)
class Twin:
    """What a study's twin left: the capacities it found (capacity.json's entries with a `twin`), its curves by
    (label, rate), and its errors against the live points (None: none computed)."""

    capacities: dict[str, dict]
    curves: dict[tuple[str, float], CurvePoint] = field(default_factory=dict)
    errors: dict | None = None


def load_twin(root: Path, capacities: dict[str, dict]) -> Twin | None:
    """The twin of the study in `root` (None: its capacities were not found on a twin)."""
    found = {lb: c for lb, c in capacities.items() if c.get("twin")}
    if not found:
        return None
    folder = Path(root) / TWIN_DIR
    try:
        curves = load_curves(folder) if (folder / INDEX_FILE).exists() else {}
    except (ReportError, OSError, ValueError, KeyError):  # a twin's sweep it cannot read leaves the curves out
        curves = {}
    path = folder / ERRORS_FILE
    errors = json.loads(path.read_text()) if path.exists() else None
    return Twin(found, curves, errors)


def load_curves(folder: Path) -> dict[tuple[str, float], CurvePoint]:
    """The twin's curves from its simulated sweep in `folder`: per (label, rate) the TTFT and E2E p50 over its
    seeds' finished requests pooled, from the requests tables alone (the report's full reading of each point's
    tables, tokens and steps too, took 3.9 s of the smoke study's 9.6 s report for 96 points on the 2-core AMD EPYC
    VM, and make run's twin has 192)."""
    pooled: dict[tuple[str, float], list] = {}
    for point in read_index(folder / INDEX_FILE).get("points", []):
        run = folder / point["dir"]
        if point["status"] not in MEASURED or not inside(folder, run) or not RunDir(run).summary.exists():
            continue
        requests = request_metrics(load_table(run, "requests", columns=CURVE_COLUMNS))
        pooled.setdefault((point["label"], index_load(point)), []).append(requests)
    curves = {}
    for (label, rate), frames in pooled.items():
        p50 = finished_p50(pd.concat(frames, ignore_index=True))
        if not math.isnan(p50["ttft_p50"]):
            curves[(label, rate)] = CurvePoint(label, rate, p50)
    return curves


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.0%}"


def _errors_cell(scopes: dict | None, key: str) -> str:
    """"model · as predicted": the model's error (each run at its own speed, each rate's repeats pooled: median /
    worst (rates)) and the twin's as it predicts each run (median / worst (runs)); a folder from before the model's
    error was kept shows the second alone."""
    scopes = scopes or {}
    predicted = _stats_text(scopes.get("low", {}).get(key))
    if "model" not in scopes:
        return predicted
    return f"{_stats_text(scopes['model'].get('low', {}).get(key))} · {predicted}"


def _stats_text(s: dict | None) -> str:
    return f"{_pct(s['median'])} / {_pct(s['worst'])} ({s['points']})" if s else "—"


def twin_rows(twin: Twin) -> list[list[str]]:
    """One row per strategy: twin μ against the live μ, the fit's time error, the capacity the twin found with
    its repeats' spread, the live confirmation, and the twin's error at ρ ≤ the summary's load."""
    errors = (twin.errors or {}).get("strategies", {})
    rows = []
    for label, c in twin.capacities.items():
        t, live = c["twin"], c.get("saturated") or {}
        spread = f" ± {t['spread_pct']:.1f}%" if t.get("spread_pct") is not None else ""
        if spread and t.get("own_spread_pct") is not None:
            spread += f" (its own runs ± {t['own_spread_pct']:.1f}%)"
        if c.get("held_to_live_mu"):
            spread += f" ⚠ held to the live μ (the twin's {t['search']['estimate_req_s']:.3g} is above its interval)"
        fit = t.get("total_time_error")
        confirm = c.get("confirmation") or {}
        check = f"{Agreement.of(confirm.get('agrees')).mark} {confirm.get('text', '')}" if confirm else "not run"
        rows.append([label, f"{t['saturated']['req_s']:.3g} / {live.get('req_s', math.nan):.3g}",
                     "—" if fit is None else f"{fit:+.1%}" + (f" (levelled × {t['levelled_by']:.3f})"
                                                                if t.get("levelled_by") else ""),
                     f"{c['estimate_req_s']:.3g} [{c['lo_req_s']:.3g}, {c['hi_req_s']:.3g}]{spread}"
                     if c.get("estimate_req_s") and c.get("lo_req_s") and c.get("hi_req_s") else "not bracketed",
                     check, *(_errors_cell(errors.get(label), k) for k in FIGURES)])
    return rows


def section(twin: Twin | None, plot: str | None = None) -> list[str]:
    """REPORT.md's section on the twin ([] without one)."""
    if twin is None:
        return []
    rho = (twin.errors or {}).get("rho_max", 0.8)
    head = ["strategy", "μ twin / live (req/s)", "fit's total step-time error", "capacity on the twin (req/s)",
            "live probe at that capacity", *(f"{name} error at ρ ≤ {rho:g}" for name in FIGURES.values())]
    lines = ["", "## The twin", "",
             "Each strategy's step model fitted to the steps its own saturated runs executed (every repeat together; "
             "`_twin/presets/`; a row count whose decode steps its terms cannot draw has a factor of its own, "
             "`decode_rows_factor`), played by the simulator with the same policy classes: its capacity was searched "
             "on virtual probes as long as deciding at each load takes, its interval widened by how much the live "
             "runs' speed (the saturated ones and the confirmation) varied against the twin on their own steps (± its "
             "95% interval, the spread pooled over every strategy's runs: one machine, runs interleaved; each "
             "strategy's own runs alone in brackets); one live probe at that capacity, as long as deciding there takes "
             "(at most the study's confirm_max_s), stands beside it: ✓ judged sustained or, its verdict undecided, its "
             "E2E p50 within what the twin predicts for its own arrivals at every speed one live run may run at; ⚠ "
             "judged not sustained or outside that prediction, with both figures. Errors are |twin ÷ live − 1| over "
             "the live grid points, each replayed on the twin with the schedule the live run sent, ρ = rate ÷ the "
             "strategy's capacity; median / worst (count), twice: first the model's error, each run replayed at the "
             "speed its machine ran that minute (the twin's time for the run's own steps ÷ theirs; how that speed "
             "varies is the ± above) and each rate's repeats pooled (count: rates), then · the twin as it predicts "
             "each run (count: runs; a short run near the knee moves far more than the machine's speed did: the "
             "per-point table's speed column).",
             ""]
    lines += md_table(head, twin_rows(twin))
    if plot:
        lines += ["", f"![{plot}]({plot})"]
    points = (twin.errors or {}).get("points", [])
    if points:
        lines += ["", "Every live point against the twin (TTFT p50 and E2E p50 in ms, throughput in output tok/s):",
                  ""]
        lines += md_table(["strategy", "λ", "repeat", "ρ", "speed (live ÷ twin)",
                           *(f"{n} live / twin / twin at its speed" for n in FIGURES.values())],
                          [[p["label"], f"{p['rate']:g}", str(p["repeat"]), _rho(p["rho"]), _speed(p.get("speed")),
                            *(_pair(p, k) for k in FIGURES)] for p in points])
    repeats = (twin.errors or {}).get("repeats", [])
    if repeats:
        labels = list(dict.fromkeys(label for r in repeats for label in r["speeds"]))
        lines += ["", "The machine's speed against each twin in each repeat of the live grid (live ÷ twin on the "
                  "run's own steps; repeats in the order they ran, each strategy's runs back to back): a drift "
                  "shared by every strategy is the machine's, which no model of the worker predicts.", ""]
        lines += md_table(["repeat", *labels, "geometric mean"],
                          [[str(r["repeat"]), *(_speed(r["speeds"].get(label)) for label in labels),
                            _speed(r["mean"])] for r in repeats])
    rates = (twin.errors or {}).get("rates", [])
    if rates:
        lines += ["", "Each live rate, its repeats pooled (TTFT p50 and E2E p50 over every finished request, in ms; "
                  "throughput the repeats' mean), against the twin replaying each repeat at its own speed:", ""]
        lines += md_table(["strategy", "λ", "repeats", "ρ", *(f"{n} live / twin (error)" for n in FIGURES.values())],
                          [[r["label"], f"{r['rate']:g}", str(r["repeats"]), _rho(r["rho"]),
                            *(_pair(r, k, error=True) for k in FIGURES)] for r in rates])
    return lines


def _rho(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _speed(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _pair(point: dict, key: str, error: bool = False) -> str:
    """"live / twin" (ms, or tok/s for throughput), the twin at the run's speed after it where there is one, or the
    error after the pair (`error`)."""
    scale = 1e3 if key != "throughput" else 1.0
    values = [point["live"][key], point["twin"][key]] + ([(point.get("at_speed") or {}).get(key)]
                                                          if point.get("at_speed") else [])
    if any(v is None or not math.isfinite(v) for v in values[:2]):
        return "—"
    text = " / ".join("—" if v is None or not math.isfinite(v) else f"{v * scale:.4g}" for v in values)
    err = (point.get("error") or {}).get(key)
    return text + (f" ({err:+.0%})" if error and err is not None else "")


def curves_plot(twin: Twin, live: dict[tuple[str, float], GroupStats], path: Path) -> Path | None:
    """TTFT p50 and E2E p50 against the offered rate: the twin's curves as lines, the live grid points with their
    95% intervals on top, each capacity on the twin as a dotted line (None: no curve to draw)."""
    if not twin.curves:
        return None
    from batchlab.report.plots import save, subplots

    fig, axes = subplots(1, 2, figsize=(12, 4.8), sharex=True)
    labels = list(dict.fromkeys(lb for lb, _ in twin.curves))
    for ax, metric in zip(axes, ("ttft", "e2e")):
        for i, label in enumerate(labels):
            color = f"C{i}"
            groups = sorted((g for (lb, _), g in twin.curves.items() if lb == label and g.p50[f"{metric}_p50"]),
                            key=lambda g: g.rate)
            ax.plot([g.rate for g in groups], [g.p50[f"{metric}_p50"] * 1e3 for g in groups], color=color,
                    label=f"{label} (twin)")
            points = sorted((g for (lb, _), g in live.items() if lb == label and g.latency[metric]["p50"]),
                            key=lambda g: g.rate)
            if points:
                y = np.array([g.latency[metric]["p50"] * 1e3 for g in points])
                ci = [g.ci.get(f"{metric}_p50") for g in points]
                lo = np.array([y[k] - c[0] * 1e3 if c else 0.0 for k, c in enumerate(ci)])
                hi = np.array([c[1] * 1e3 - y[k] if c else 0.0 for k, c in enumerate(ci)])
                ax.errorbar([g.rate for g in points], y, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt="o",
                            color=color, capsize=3, label=f"{label} (live)")
            cap = twin.capacities.get(label, {}).get("estimate_req_s")
            if cap:
                ax.axvline(cap, color=color, linestyle=":", alpha=0.7)
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_title(f"{metric.upper()} p50: twin (lines), live (95% CI), capacity (dotted)", fontsize=10)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    return save(fig, path)
