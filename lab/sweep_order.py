"""Which points a sweep's plan runs, in what order and at which rates: repeat → rate → strategy with the strategies'
order turned each repeat, interleaved or grouped by warm workers, the capacity probe's point, and rates placed from
measured capacities. Pure: no runs, no I/O (the plan itself: lab.sweep_plan)."""
import math
from pathlib import Path

from batchlab.collector.layout import point_dir
from batchlab.lab.sweep_plan import Plan, Point
from batchlab.protocol.errors import SweepError
from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.protocol.study_settings import AutoRates


def plan_points(plan: Plan, rates: list[float], out: Path) -> list[Point]:
    """Repeat → rate → strategy, so an interrupted sweep already holds whole comparisons; the strategies'
    order turns by one each repeat, so that none always runs first (or right after another) at a rate."""
    n = len(plan.entries)
    if plan.concurrency:  # closed loop: one point per client count, in its concurrency=<n> folder
        return [Point(e, math.inf, k, plan.seed, out / point_dir(e.label, math.inf, k, concurrency=c), c)
                for k in range(plan.repeats) for c in plan.concurrency
                for e in plan.entries[k % n:] + plan.entries[:k % n]]
    return [Point(e, r, k, plan.seed, out / point_dir(e.label, r, k))
            for k in range(plan.repeats) for r in rates
            for e in plan.entries[k % n:] + plan.entries[:k % n]]


def interleaved(plan: Plan) -> bool:
    """Whether the sweep runs its points in the plan's order, every worker group's pool kept warm (the
    strategies at a rate run minutes apart, not a whole group apart: a machine whose speed drifts shifts
    them alike), or group by group with one pool at a time (`grouped`; `auto` picks it when a point
    runs on a GPU, where two idle engines would hold two models' memory)."""
    if plan.order != "auto":
        return plan.order == "interleaved"
    settings = [{**plan.base, **e.overrides} for e in plan.entries]
    devices = {str(s.get("device") or RunConfig().device) for s in settings
               if s.get("backend", RunConfig().backend) in ("hf", "vllm")}  # sim and openai hold no model
    if "auto" in devices:
        import torch  # what the workers' `auto` will pick

        devices = (devices - {"auto"}) | {"cuda" if torch.cuda.is_available() else "cpu"}
    return devices <= {"cpu"}


def warm_order(points: list[Point], base: dict, key_of, first: str | None = None) -> list[Point]:
    """Points regrouped so that those whose workers share a key (`key_of(RunConfig)`) run one after
    another on the same warm workers; within a group the plan's order (repeat → rate → strategy) is
    kept, groups come in the order of their first point (the group of the entry labelled `first`, the
    probe's, leads: its workers are already warm)."""
    groups: dict = {}
    for p in points:
        try:
            key = key_of(p.config(base))
        except ConfigError:  # a point with a bad setting fails on its own when it runs
            key = ("invalid", p.entry.label)
        groups.setdefault(key, []).append(p)
    ordered = list(groups.values())
    ordered.sort(key=lambda g: not any(p.entry.label == first for p in g))
    return [p for g in ordered for p in g]


def probe_point(plan: Plan, folder: Path) -> tuple[Point, float]:
    """The capacity probe's run (a burst of probe_requests within probe_duration_s on the entry labelled
    grid.rates.auto.probe, else `dynamic`, else the first; in its point folder under `folder`, with every run
    folder's partition keys) and its duration, s."""
    auto, entries = plan.auto, plan.entries
    wanted = auto.probe or next((e.label for e in entries if e.label == "dynamic"), entries[0].label)
    entry = next((e for e in entries if e.label == wanted), None)
    if entry is None:
        raise SweepError(f"grid.rates.auto.probe: no strategy labelled {wanted!r}")
    rate = auto.probe_requests / auto.probe_duration_s
    return Point(entry, rate, 0, plan.seed, folder / point_dir(entry.label, rate, 0)), auto.probe_duration_s


def floor_3g(value: float, significant: int = 3) -> float:
    """`value` rounded down to 3 (or `significant`) significant digits (a rate that must stay at or below the one
    it came from)."""
    digits = significant - 1 - math.floor(math.log10(value))
    return float(f"{math.floor(value * 10 ** digits) / 10 ** digits:.{significant}g}")


def span_rates(capacities_req_s: list[float], auto: AutoRates) -> list[float]:
    """Rates that show every knee: `points` log-spaced from low × the lowest capacity to high × the highest
    (3 significant digits, distinct)."""
    lowest, highest, n = auto.low * min(capacities_req_s), auto.high * max(capacities_req_s), auto.points
    return sorted({float(f"{lowest * (highest / lowest) ** (i / (n - 1)):.3g}") for i in range(n)})


def auto_rates(capacity_req_s: float, fractions: list[float]) -> list[float]:
    """Fractions of the measured capacity, 3 significant digits, distinct and positive."""
    rates = {float(f"{capacity_req_s * f:.3g}") for f in fractions}
    return sorted(r for r in rates if r > 0)
