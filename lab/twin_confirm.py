"""A twin's capacity confirmed live (docs/capacity.md, "The twin"): one live probe at the twin's capacity, as long as
deciding there takes and at most confirm_max_s.

1. **Its verdict** (stats.verdict): sustained agrees with the twin, not sustained disagrees (⚠). Near the knee a
   queue takes far longer to settle than a probe runs (at ρ = 0.95, minutes to hours), so it is often undecided,
   said with how long deciding would take.
2. **Its prediction** (`TwinPrediction`), which decides where the verdict cannot: the twin plays the probe's own
   arrivals (its schedule, prompts and output lengths) at every speed one live run may run at against it (the 95%
   prediction interval of one run's speed, lab.twin.speed_ranges), and never over less than ± the twin search's
   width (`judged_speeds`: the twin's capacity is known no finer than that). The probe agrees when its E2E p50 lies
   within what the twin predicts there, and disagrees (⚠, both figures) outside it: a capacity too high for the
   machine shows as a probe slower than the twin's slowest prediction, one too low as a faster one. The twin and the
   live run share every arrival and every prompt, so what is left to differ is the machine's speed and the model.

The same schedule's verdict on the twin stands beside the live one (`twin_text`).
"""
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from batchlab.lab.sweep_order import floor_3g
from batchlab.lab.sweep_plan import AutoRates, Entry
from batchlab.lab.twin import TWIN_WIDTH, at_speed, decide_s, run_speed
from batchlab.protocol.verdicts import AgreedBy, Sustain
from batchlab.stats.capacity import Probe
from batchlab.stats.metrics import finished_p50
from batchlab.stats.verdict import arrival_cv2

# the speeds a probe's arrivals are played at across its range: its E2E p50 is not monotone in the speed (a dynamic
# batch's timeout or a step's end falls before or after an arrival), so the range's ends alone could miss its extremes
PREDICTED_SPEEDS = 9
PREDICTED = "e2e_p50"  # the figure predicted: every request's whole time, its queueing included


@dataclass(frozen=True, slots=True)
class TwinPrediction:
    """What the twin predicts for a live probe's arrivals: its E2E p50 (s) played at speeds across `speeds` (lo, hi:
    one live run's 95% range against the twin), `lo_s` to `hi_s`, beside the live run's (`live_s`) and the speed
    the probe itself ran at (run_speed: None where its steps could not be read)."""

    live_s: float
    lo_s: float
    hi_s: float
    speeds: tuple[float, float]
    speed: float | None = None

    @property
    def within(self) -> bool:
        """Whether the live figure lies where the twin predicts it."""
        return self.lo_s <= self.live_s <= self.hi_s

    def text(self) -> str:
        """'its E2E p50 1.82 s is within the twin's 1.52-1.92 s for the same arrivals at 0.87-1.15× its speed'."""
        where = "within" if self.within else "above" if self.live_s > self.hi_s else "below"
        ran = f"; the probe ran at {self.speed:.2f}×" if self.speed is not None and not self.within else ""
        digits = 2 if self.speeds[1] / self.speeds[0] > 1.02 else 3  # a sim worker's range: 0.997-1.003×
        return (f"its E2E p50 {self.live_s:.3g} s is {where} the twin's {self.lo_s:.3g}–{self.hi_s:.3g} s for the "
                f"same arrivals at {self.speeds[0]:.{digits}f}–{self.speeds[1]:.{digits}f}× its speed{ran}")


@dataclass(slots=True)
class Confirmation:
    """The live probe at a twin's capacity: its verdict, how long deciding there takes and how long it ran, the
    same schedule's verdict on the twin, the twin's prediction for its arrivals and the speed it ran at."""

    probe: Probe
    needs_s: float
    ran_s: float
    twin: Probe | None = None  # the same probe's schedule played on the twin (its verdict beside the live one)
    prediction: TwinPrediction | None = None
    speed: float | None = None  # the probe's speed against the twin (lab.twin.run_speed)

    @property
    def agreed_by(self) -> AgreedBy | None:
        """What decides the agreement: the live verdict where it is decided, else the prediction (None: neither)."""
        if self.probe.verdict.outcome is not Sustain.UNDECIDED:
            return AgreedBy.VERDICT
        return AgreedBy.PREDICTION if self.prediction is not None else None

    @property
    def agrees(self) -> bool | None:
        """Whether the live probe agrees with the twin's capacity: its verdict (sustained True; judged not sustained
        False, a disagreement) where decided; else its E2E p50 within the twin's prediction (True) or outside it
        (False); None with neither."""
        if self.agreed_by is AgreedBy.PREDICTION:
            return self.prediction.within
        return self.probe.verdict.outcome.agreement.flag

    def text(self) -> str:
        """One line: the verdict, with why where it is not a plain ✓, and the prediction that decided it."""
        p, v = self.probe, self.probe.verdict
        where = f"λ = {p.rate_req_s:.3g} (offered {p.offered_req_s:.3g}) req/s, {self.ran_s:.0f} s"
        if v.outcome is Sustain.SUSTAINED:
            return f"{v.outcome} at {where}"
        if v.outcome is Sustain.NOT_SUSTAINED:
            return f"{v.outcome} at {where}: {'; '.join(v.reasons)}"
        if not math.isfinite(self.needs_s):  # the twin's estimate may stand above the live μ, within its interval
            line = f"{v.outcome} at {where} (at or above the live μ: no length of traffic decides there)"
        else:
            line = f"{v.outcome} at {where} (deciding there takes about {self.needs_s:.0f} s of traffic)"
        return f"{self.prediction.text()}; its verdict: {line}" if self.prediction is not None else line

    def twin_text(self) -> str:
        """The twin on the same schedule: its mark, served share and queue trend beside the live run's."""
        if self.twin is None:
            return ""
        t, v = self.twin.verdict, self.probe.verdict
        return (f"same schedule on the twin: {t.mark} served {t.served_share:.0%}, queue {t.queue_growth:+.2f}/s "
                f"(live {v.mark} served {v.served_share:.0%}, queue {v.queue_growth:+.2f}/s)")

    def as_dict(self) -> dict:
        """capacity.json's `confirmation`."""
        by = self.agreed_by
        return {"rate_req_s": self.probe.rate_req_s, "offered_req_s": self.probe.offered_req_s,
                "folder": self.probe.folder, "needs_s": self.needs_s, "ran_s": self.ran_s, "agrees": self.agrees,
                "agreed_by": str(by) if by else None, "text": self.text(), "twin_text": self.twin_text(),
                **asdict(self.probe.verdict), "twin_verdict": asdict(self.twin.verdict) if self.twin else None,
                "prediction": asdict(self.prediction) if self.prediction else None, "speed": self.speed}


def confirmation_rate(doc: dict) -> float | None:
    """The live probe's rate: the twin's capacity estimate (3 significant digits, rounded down: at or just
    below it), else the highest rate its twin sustained."""
    value = doc.get("estimate_req_s") or (doc.get("bracket_req_s") or [None])[0]
    return floor_3g(value) if value else None


def confirm(live, entry: Entry, target_req_s: float, saturated: dict, settings: AutoRates,
            preset: Path | None = None, twin_saturated: dict | None = None,
            speeds: tuple[float, float] | None = None) -> Confirmation:
    """The live probe offering `target_req_s` on `live` (a lab.capacity_search.LiveSearch), as long as deciding
    there takes and at most confirm_max_s, judged against the live μ; with the twin's `preset`, its schedule played
    on the twin, its speed against it, and (with `speeds`, lab.twin.speed_ranges') the twin's prediction."""
    from batchlab.lab.sweep_plan import Point

    cfg = Point(entry, target_req_s, 0, live.plan.seed, Path(".")).config(live.plan.base)
    limited = bool(cfg.max_queue or cfg.max_queue_tokens or cfg.slos())
    cv2 = arrival_cv2(cfg.arrival, cfg.burstiness)
    ran = min(decide_s(target_req_s, saturated.get("req_s"), settings, limited, cv2), settings.confirm_max_s)
    rate = nominal_for(target_req_s, ran, cfg)
    probe = live.measure(entry, saturated, duration_s=ran)(rate)
    needs = decide_s(probe.offered_req_s, saturated.get("req_s"), settings, limited, cv2)
    check = Confirmation(probe, needs, ran)
    if preset and probe.folder:
        from batchlab.worker.stepmodel import load_preset

        folder = live.out / probe.folder
        check.twin = on_twin(folder, preset, twin_saturated, ran)
        check.speed = run_speed(load_preset(preset), folder)
        check.prediction = (predicted(folder, preset, judged_speeds(speeds, min(settings.width, TWIN_WIDTH)),
                                      check.speed) if speeds else None)
    return check


def judged_speeds(speeds: tuple[float, float], width: float) -> tuple[float, float]:
    """The speeds a probe's prediction is played over: one run's range (lab.twin.speed_ranges), at least ±`width`
    (the twin search's) about its centre. A sim worker's steps are the model's to ±0.1%, where the twin's capacity
    is known to its search's 3% and a dynamic batch's E2E p50 moves 2-5% between speeds 1% apart (which arrivals a
    batch's timeout catches): judged to ±0.1%, the smoke study's three probes all read as disagreeing by 0.2-4%."""
    centre = math.sqrt(speeds[0] * speeds[1])
    return min(speeds[0], centre / (1 + width)), max(speeds[1], centre * (1 + width))


def on_twin(folder: Path, preset: Path, saturated: dict | None, duration_s: float) -> Probe | None:
    """A live probe's schedule played on the twin, judged as the live probe was (against the twin's μ)."""
    from batchlab.lab.capacity_search import probe_of
    from batchlab.lab.twin_replay import replayed

    if not (folder / "schedule.parquet").exists():
        return None
    tables, cfg = replayed(folder, preset)
    return probe_of(cfg.rate, tables.requests, duration_s, cfg, str(folder), saturated)


def predicted(folder: Path, preset: Path, speeds: tuple[float, float],
              speed: float | None = None) -> TwinPrediction | None:
    """The twin's prediction for a live run folder's arrivals: its E2E p50 over finished requests, played at
    PREDICTED_SPEEDS speeds log-spaced across `speeds`, beside the live run's; None where the run has no schedule
    or no summary (it failed), or no finished request (live, or at every speed)."""
    from batchlab.collector.parts import load_table
    from batchlab.lab.twin_replay import replayed
    from batchlab.protocol.run_dir import RunDir
    from batchlab.worker.stepmodel import load_preset

    if not (RunDir(folder).schedule.exists() and RunDir(folder).summary.exists()):
        return None
    live = finished_p50(load_table(folder, "requests"))[PREDICTED]
    model, values = load_preset(preset), []
    with tempfile.TemporaryDirectory() as tmp:
        for factor in np.exp(np.linspace(math.log(speeds[0]), math.log(speeds[1]), PREDICTED_SPEEDS)):
            tables, _ = replayed(folder, at_speed(model, float(factor), Path(tmp) / "at_speed.yaml"))
            values.append(finished_p50(tables.requests)[PREDICTED])
    values = [v for v in values if math.isfinite(v)]
    if not (values and math.isfinite(live)):
        return None
    return TwinPrediction(live, min(values), max(values), (float(speeds[0]), float(speeds[1])), speed)


def nominal_for(target_req_s: float, duration_s: float, cfg) -> float:
    """The nominal rate whose seeded schedule offers the most it can at or below `target_req_s` over its first
    `duration_s` (a seeded Poisson schedule of a few seconds is several percent off its nominal rate, and offers
    whole arrivals: 4 s offer multiples of 0.25 req/s), 4 significant digits, rounded down. Bisected: a seeded
    schedule's arrivals only move earlier as its rate rises (its gaps are one draw, scaled by 1 ÷ the rate)."""
    from batchlab.traffic.arrivals import arrival_offsets

    def offered(rate: float) -> float:
        offsets = arrival_offsets(cfg.arrival, rate, duration_s, np.random.default_rng([cfg.seed, 0]),
                                  burstiness=cfg.burstiness)
        return np.count_nonzero(offsets <= duration_s) / duration_s

    lo, hi = target_req_s / 4, target_req_s * 4  # offered(lo) ≤ target < offered(hi), else lo is the best there is
    if offered(lo) > target_req_s:
        return floor_3g(lo, 4)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if offered(mid) <= target_req_s else (lo, mid)
        if hi - lo < lo * 1e-5:
            break
    return floor_3g(lo, 4)  # rounded down: still at or below the target
