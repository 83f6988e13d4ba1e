"""The study's twin: each strategy's step model fitted to its own saturated runs (lab.calibrate_runs), played
by the simulator where live runs are too short to decide, and checked live (docs/capacity.md, "The twin").

1. **Fit** (`fit_twin`): the executed steps of a strategy's saturated runs, every repeat together, give its
   twin's step model (OUT/_twin/presets/<label>.yaml, a preset `batchlab simulate --preset KIND=FILE` replays).
   Each saturated run's executed steps are then timed on the twin: the twin's time for them ÷ their live time is
   one sample of how fast the machine ran against the twin (its speed that minute), free of which prompts the run
   drew; their mean (`bias_pct`, near 0: the fit is levelled to the runs' total step time) and the half-width of
   its 95% t-interval on the log scale (`spread_pct`) are the twin's uncertainty, the standard deviation pooled
   over every strategy's runs (`pooled_spreads`: one machine's speed, in runs interleaved), each strategy's own
   beside it (`own_spread_pct`).
2. **Capacity in virtual time** (`TwinSearch`): lab.rate_search's search and stats.verdict's verdict, on probes as
   long as deciding at the load probed takes (the queue's settle time, twice, after the warm-up quarter), and at least
   TWIN_PROBE_MIN_S and at most TWIN_PROBE_MAX_S of virtual traffic; the interval is the search's own, widened by the
   twin's uncertainty.
3. **Confirmed live**: one live probe at the twin's capacity, judged by its verdict or, undecided, by what the twin
   predicts for its arrivals over the range one run's speed falls in (`speed_ranges`): lab.twin_confirm.

The curves and the twin's error against the live points are lab.twin_curves'.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path

from batchlab.collector.layout import TWIN_DIR
from batchlab.lab.capacity_search import SimulatedSearch, probe_duration_s
from batchlab.lab.rate_search import search
from batchlab.lab.sweep_plan import AutoRates, Entry, Plan
from batchlab.protocol.errors import CalibrateError
from batchlab.protocol.study_settings import TWIN_PROBE_MAX_S, TWIN_PROBE_MIN_S
from batchlab.stats.capacity import CapacityEstimate
from batchlab.stats.intervals import mean_interval, pooled_half_widths
from batchlab.stats.saturation import SaturatedRun, pooled
from batchlab.stats.verdict import SETTLE_TIMES, WARMUP_SHARE, arrival_cv2, settle_time_s

PRESETS_DIR = "presets"
TWIN_SATURATED_S = 120.0  # a twin's saturated run (one per live repeat's seed), virtual: its μ the model's, not luck
# its closed loop's pool of requests, per second of traffic (the live runs' 200 a second would tokenize 24,000
# ShareGPT prompts for 120 s, about 15 s on 2 cores; a pool that runs dry ends the traffic and μ's window with it)
TWIN_POOL_REQ_S = 50.0
TWIN_WIDTH = 0.03  # the twin's search stops at a bracket this narrow (virtual probes cost little) ...
TWIN_MAX_PROBES = 12  # ... or after this many probes
# its first probe at μ ÷ (1 + TWIN_START_WIDTHS × width), not the live search's μ ÷ √(1 + width): the twin's μ is
# exact to a few percent (2 × 120 s), and a queue's knee lies below it, where the live search's first probe, at
# 0.985 μ, is rarely sustained and is its longest (1200 s). On the smoke study's saturated runs (2-core AMD EPYC VM)
# the continuous twin's search took 2.8 s, not 10.3 s (2 probes, not 6), naive's 1.5 s, not 2.2 s, and every
# estimate moved by at most 2% (within the search's own 3%, before the twin's speed spread widens it)
TWIN_START_WIDTHS = 2


@dataclass(slots=True)
class TwinFit:
    """A strategy's twin: its fitted preset, the backend kind it models, and the live runs it was fitted to."""

    label: str
    preset: Path
    kind: str
    runs: list[SaturatedRun] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    record: dict = field(default_factory=dict)  # the fit's record (lab.calibrate_runs: its errors per shape kind)


def preset_path(out: Path, label: str) -> Path:
    """Where a strategy's twin preset goes."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
    return out / TWIN_DIR / PRESETS_DIR / f"{safe}.yaml"


def fit_twin(out: Path, label: str, runs: list[SaturatedRun]) -> TwinFit:
    """The twin of one strategy from its saturated runs' folders (relative to `out`); CalibrateError when the
    runs cannot give a step model (a failed read, too few step shapes)."""
    from batchlab.lab.calibrate_runs import fit_folders, run_facts
    from batchlab.worker.stepmodel import save_preset

    kept = [r for r in runs if r.folder]
    folders = [out / r.folder for r in kept]
    if not folders:
        raise CalibrateError(f"{label}: no saturated run folder to fit its twin to")
    facts = run_facts(folders[0])
    model, _, record = fit_folders(folders, facts, "auto", f"twin-{label}", tie_rows=prior_of(facts))
    model, record = level(model, record)
    path = preset_path(out, label)
    save_preset(model, path, {**record, "twin_of": label})
    return TwinFit(label, path, facts["kind"], kept, folders, record)


TIME_TERMS = ("prefill_s_per_token", "overhead_s", "decode_s_per_row", "decode_s_per_context_token",
              "prefill_s_per_row", "prefill_s_per_token_pair", "prefill_overhead_s", "gemm_s_per_token")


def level(model, record: dict):
    """The fitted model scaled so that its steps take the runs' total time (the record's `total_time_error`, the
    fit's, is then undone; `levelled_by` says by what factor): a fit on relative error weighs a rare long step (a
    prompt's) as much as a common short one, and read `make run`'s HF continuous steps 10% short in total, which a
    twin would carry into every throughput and capacity."""
    from dataclasses import replace

    error = record.get("total_time_error")
    if not error or not math.isfinite(error) or error <= -1:
        return model, record
    factor = 1 / (1 + error)
    terms = {k: getattr(model, k) * factor for k in TIME_TERMS if getattr(model, k) is not None}
    if model.bandwidth_Bps:
        terms["bandwidth_Bps"] = model.bandwidth_Bps / factor
    return replace(model, **terms), {**record, "levelled_by": factor}


def prior_of(facts: dict):
    """The shipped preset calibrated for this kind, model and device (its `calibration` record says so), whose
    proportions tie the terms full batches cannot tell apart (lab.calibrate_runs.row_ties); None without one."""
    import yaml

    from batchlab.lab.simulate import CALIBRATED_KIND
    from batchlab.worker.stepmodel import PRESET_DIR, load_preset

    for path in sorted(PRESET_DIR.glob("*.yaml")):
        record = (yaml.safe_load(path.read_text()) or {}).get("calibration") or {}
        kind = CALIBRATED_KIND.get((record.get("backend"), record.get("mode")))
        if (kind == facts["kind"] and record.get("model") == facts["model"]
                and str(record.get("device", "")) == facts["device"]):
            return load_preset(path)
    return None


def speed_ratios(fit: TwinFit) -> list[float]:
    """Each saturated run's speed against its twin (run_speed). The very steps, so neither which prompts the run
    drew nor which few batches a 9 s run's window or busy time counted moves it (a replay's μ did: make run's
    dynamic runs read 1.02, 1.16, 0.96, 1.19 so, where their steps' own ratios were 1.04, 1.03, 0.96, 0.97)."""
    from batchlab.worker.stepmodel import load_preset

    model = load_preset(fit.preset)
    return [r for r in (run_speed(model, folder) for folder in fit.folders) if r is not None]


def run_speed(model, folder: Path) -> float | None:
    """A live run's speed against a twin's model: the twin's time for the run's own executed steps ÷ the time
    they took live (> 1: the machine ran faster than the twin); None when its steps cannot be read."""
    from batchlab.lab.calibrate_runs import total_time_error
    from batchlab.worker.run_steps import RunStepsError, read_run_steps

    try:
        error = total_time_error(model, read_run_steps(folder, model.padded, model.fused).steps)
    except RunStepsError:
        return None
    return 1 + error if math.isfinite(error) and error > -1 else None


def at_speed(model, speed: float, path: Path) -> Path:
    """The twin's model run at `speed` (run_speed's: every time term ÷ it), written as a preset to `path`: a
    live run replayed at the speed its machine ran that minute, so only the model's shape is left to differ."""
    from batchlab.worker.stepmodel import save_preset

    levelled, _ = level(model, {"total_time_error": speed - 1})
    save_preset(levelled, path, {"at_speed": speed})
    return path


def twin_plan(plan: Plan, presets: dict[str, Path]) -> Plan:
    """The plan with each labelled entry playing its twin's preset (the others left out)."""
    from dataclasses import replace

    entries = [Entry(e.label, {**e.overrides, "preset": str(presets[e.label])}) for e in plan.entries
               if e.label in presets]
    return replace(plan, entries=entries)


def decide_s(rate: float, mu: float | None, s: AutoRates, limited: bool, cv2: float = 1.0) -> float:
    """A probe's traffic long enough to decide at `rate`: the search's own length, and, where the queue's level
    decides (a queue limit or SLOs) and μ is known, SETTLE_TIMES settle times after the warm-up quarter."""
    base = probe_duration_s(rate, s)
    if not (limited and mu):
        return base
    return max(base, SETTLE_TIMES * settle_time_s(rate, mu, cv2) / (1 - WARMUP_SHARE))


class TwinSearch(SimulatedSearch):
    """The capacity search in virtual time on the twin's presets: one long saturated run, and probes as long as
    deciding at their load takes (TWIN_PROBE_MIN_S to TWIN_PROBE_MAX_S)."""

    def __init__(self, plan: Plan, settings: AutoRates) -> None:
        super().__init__(plan, settings.model_copy(update={
            "saturated_duration_s": TWIN_SATURATED_S, "width": min(settings.width, TWIN_WIDTH),
            "max_probes": max(settings.max_probes, TWIN_MAX_PROBES)}), TWIN_POOL_REQ_S)
        self.asked = settings

    def probe_s(self, entry: Entry, rate: float, saturated: dict | None) -> float:
        """A virtual probe's traffic at `rate`."""
        cfg = self._config(entry)
        limited = bool(cfg.max_queue or cfg.max_queue_tokens or cfg.slos())
        need = decide_s(rate, (saturated or {}).get("req_s"), self.s, limited, arrival_cv2(cfg.arrival, cfg.burstiness))
        return min(max(need, TWIN_PROBE_MIN_S), TWIN_PROBE_MAX_S)

    def _config(self, entry: Entry):
        from batchlab.lab.sweep_plan import Point

        return Point(entry, 1.0, 0, self.plan.seed, Path(".")).config(self.plan.base)


def twin_capacity(plan: Plan, fit: TwinFit, settings: AutoRates) -> tuple[CapacityEstimate, dict]:
    """A strategy's capacity on its twin, and the twin's record: its μ in virtual time, the live ÷ twin speed of
    each saturated run on its own steps (speed_ratios), their mean (`bias_pct`) and the half-width of its 95%
    interval (`spread_pct`), and the search's own record before that spread widened it."""
    plan = twin_plan(plan, {fit.label: fit.preset})
    entry = next(iter(plan.entries))
    twin = TwinSearch(plan, settings)
    # one virtual saturated run per live repeat, on that repeat's seed: a seed's prompts alone move a padded
    # static worker's μ by ±10% even over 120 s (docs/capacity.md), and the live μ pools these very seeds
    saturated = pooled([twin.saturated(entry, r) for r in sorted({run.repeat for run in fit.runs} or {0})])
    start = saturated["req_s"] / (1 + TWIN_START_WIDTHS * twin.s.width)
    cap = search(fit.label, start, twin.measure(entry, saturated), width=twin.s.width,
                 max_probes=twin.s.max_probes, saturated=saturated)
    record = {"preset": str(fit.preset), "kind": fit.kind, "saturated": saturated,
              **with_speeds(speed_ratios(fit)),
              "search": cap.as_dict(), "fit_error": fit.record.get("fit_error"),
              "total_time_error": fit.record.get("total_time_error"), "levelled_by": fit.record.get("levelled_by")}
    return cap, record


def with_speeds(ratios: list[float]) -> dict:
    """The twin record's speed fields from the live runs' speeds against it (run_speed): `speed_ratios`, their
    geometric mean's offset (`bias_pct`) and the half-width of its 95% t-interval (`spread_pct`, None with fewer
    than 2)."""
    logs = [math.log(r) for r in ratios]
    half = mean_interval(logs)[1] if len(logs) >= 2 else math.nan
    return {"speed_ratios": list(ratios),
            "bias_pct": (math.exp(sum(logs) / len(logs)) - 1) * 100 if logs else None,
            "spread_pct": (math.exp(half) - 1) * 100 if math.isfinite(half) else None}


def pooled_spreads(records: dict[str, dict]) -> None:
    """Each twin record's `spread_pct` from the speeds of every strategy's live runs together (label → the twin
    record; with_speeds' fields, updated in place): how fast the machine ran against a twin in one minute is one
    noise, shared by every strategy's runs since they are interleaved (serpentine order), so its standard deviation
    is pooled over all of them (stats.intervals.pooled_half_widths: `make run`'s 4 or 5 runs a strategy give 12 to
    16 degrees of freedom, t 2.1-2.2, where each alone had 3 or 4, t 2.8-3.2, and read the same noise at ±7% to
    ±22%); the strategy's own runs' alone stay as `own_spread_pct`, `spread_df` the pooled degrees of freedom.
    Unchanged with fewer than two runs in all."""
    logs = {label: [math.log(r) for r in rec.get("speed_ratios") or []] for label, rec in records.items()}
    halves, df = pooled_half_widths(logs)
    for label, rec in records.items():
        if not math.isfinite(halves[label]):
            continue
        rec.update(own_spread_pct=rec.get("spread_pct"), spread_pct=(math.exp(halves[label]) - 1) * 100, spread_df=df)


def speed_ranges(ratios: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    """label → the range one more live run's speed against its twin falls in, 95% of the time: the geometric mean
    of its saturated runs' speeds (run_speed) × e^(±h), h the half-width of one new value's t-interval on their
    logs with the standard deviation pooled over every strategy's runs (pooled_spreads' reason). The range a live
    confirmation's figures are predicted over (lab.twin_confirm); a label with no degree of freedom has none."""
    logs = {label: [math.log(r) for r in values] for label, values in ratios.items() if values}
    halves, _ = pooled_half_widths(logs, new=True)
    out = {}
    for label, values in logs.items():
        centre = sum(values) / len(values)
        if math.isfinite(halves[label]):
            out[label] = (math.exp(centre - halves[label]), math.exp(centre + halves[label]))
    return out


def widened(doc: dict, spread_pct: float | None, ceiling_req_s: float | None = None) -> dict:
    """A capacity entry's interval (req/s and tok/s) widened by the twin's uncertainty (× e^±h), its top never
    above `ceiling_req_s` (the live μ's upper bound: no rate above it is sustained, the rule CapacityEstimate's
    own top follows) nor below the estimate; unchanged without a spread."""
    if not spread_pct:
        return doc
    factor = 1 + spread_pct / 100
    out = dict(doc)
    hi, estimate = out.get("hi_req_s"), out.get("estimate_req_s")
    top = factor
    if hi and ceiling_req_s:
        top = max(min(hi * factor, ceiling_req_s), estimate or 0.0) / hi
    for unit in ("req_s", "tok_s"):
        if out.get(f"lo_{unit}") is not None:
            out[f"lo_{unit}"] = out[f"lo_{unit}"] / factor
        if out.get(f"hi_{unit}") is not None:
            out[f"hi_{unit}"] = out[f"hi_{unit}"] * top
    return out


def held_to(cap: CapacityEstimate, live: dict | None) -> tuple[CapacityEstimate, bool]:
    """A twin's capacity held to the live μ (its estimate, and the interval's low end, never above it: the rule the
    live search's estimate follows, CapacityEstimate's `saturated`) when the live runs contradict it: its estimate
    above the upper end of the live μ's 95% interval. And whether that held it. Within that interval the twin's
    estimate stands: its long probes average some 500 prompts a seed where a 9 s live run completes its seed's first
    ~40, and the live μ of four such runs is ±20-25% wide (docs/capacity.md)."""
    from dataclasses import replace

    estimate, top = cap.estimate_req_s, (live or {}).get("req_s_hi")
    if not (estimate and top and math.isfinite(top) and estimate > top):
        return cap, False
    return replace(cap, saturated=live), True
