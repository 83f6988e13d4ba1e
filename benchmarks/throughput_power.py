"""Which saturated-run design and μ estimator let `make run` see a throughput difference on a busy machine.

Virtual time: `make run`'s four strategies (configs/cpu.yaml: naive and dynamic on the HF static step model,
continuous on the HF loop's, vLLM on vLLM's, each fitted to this CPU) run saturated (16 closed-loop clients,
ShareGPT lengths), one after another along ONE simulated machine's timeline (worker.machine_noise: a slow
drift of the machine's speed between runs, a fast one within them, and a neighbour taking a share of the
time in bursts), so that two runs close in time see nearly the same machine, as on a real box. For each
design (repeats × seconds per run, the order within a repeat) and each μ estimator (stats.saturation),
over many seeds: how often the paired throughput comparison against naive is significant in the right
direction, how often its 95% interval covers the noise-free ratio, and its median width.

    python benchmarks/throughput_power.py                  # every scenario, design and estimator
    python benchmarks/throughput_power.py --seeds 20 --scenarios busy
"""
import argparse
import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from batchlab.protocol.settings import RunConfig
from batchlab.simulator.run import simulate
from batchlab.stats.intervals import between_repeats
from batchlab.stats.saturation import ESTIMATORS
from batchlab.traffic.run_schedule import make_schedule
from batchlab.worker.machine_noise import MachineNoise

BASE = dict(backend="sim", dataset="sharegpt", max_new_tokens=32, max_prompt_len=256, rate=math.inf, concurrency=16,
            max_queue=0, batch_size=8, max_batch_size=8, max_wait_ms=200, warmup_requests=0, num_requests=0)
STRATEGIES = {  # label → settings (configs/cpu.yaml's grid, on the presets fitted to this CPU)
    "naive": dict(strategy="naive", preset="cpu-tiny-mistral"),
    "dynamic": dict(strategy="dynamic", preset="cpu-tiny-mistral"),
    "continuous": dict(strategy="continuous", preset="cpu-tiny-mistral-loop"),
    "vllm": dict(strategy="continuous", preset="cpu-tiny-mistral-vllm"),
}
GAP_S = 6.0  # between two saturated runs on one timeline: drain, the next run's start-up
SCENARIOS = {  # name → the machine: (slow drift σ, τ s), (fast drift σ, τ s), (neighbour share, on s, off s)
    "quiet": ((0.05, 120.0), (0.03, 1.0), (0.0, 1.0, 1.0)),
    "busy": ((0.15, 60.0), (0.10, 2.0), (0.3, 3.0, 6.0)),
    "very busy": ((0.30, 30.0), (0.20, 2.0), (0.5, 2.0, 2.0)),
}
SPEED = 0.4  # the presets' step times × this: their noise-free μ then match this VM's live make run (naive 6.45,
# continuous 9.66, vLLM 13.6 req/s on 2026-12-02; the presets, fitted on an earlier machine, are 2.5× slower)
DESIGNS = {  # name → (repeats, seconds per saturated run or "N req": a fixed number of requests, order)
    "3×15 s": (3, 15.0, "fixed"),
    "5×9 s": (5, 9.0, "fixed"),
    "5×9 s serpentine": (5, 9.0, "serpentine"),
    "3×96 req": (3, "96 req", "fixed"),
    "5×64 req serpentine": (5, "64 req", "serpentine"),
    "6×48 req serpentine": (6, "48 req", "serpentine"),
}


@dataclass
class Timeline:
    """One machine: the product of a slow drift, a fast one and a bursty neighbour, read from offset_s."""

    parts: tuple[MachineNoise, ...]
    offset_s: float = 0.0

    def factor(self, t: float) -> float:
        return SPEED * math.prod(p.factor(self.offset_s + t) for p in self.parts)


def timeline(scenario: str, seed: int) -> Timeline:
    (slow, slow_s), (fast, fast_s), (share, on_s, off_s) = SCENARIOS[scenario]
    return Timeline((MachineNoise(speed_drift=slow, speed_drift_s=slow_s, keys=("slow", seed)),
                     MachineNoise(speed_drift=fast, speed_drift_s=fast_s, keys=("fast", seed)),
                     MachineNoise(neighbour_share=share, neighbour_on_s=on_s, neighbour_off_s=off_s,
                                  keys=("neighbour", seed))))


def run(label: str, length: float | str, repeat: int, seed: int, noise=None):
    """A saturated run's tables and its traffic's end (s): `length` seconds of traffic, or "N req": the first N
    requests of the schedule, every strategy the same ones (the traffic ends with the last one sent)."""
    stop = dict(num_requests=int(length.split()[0]), duration_s=3600.0) if isinstance(length, str) else \
        dict(duration_s=length, num_requests=int(40 * length))  # a pool beyond what any strategy takes, not 10,000
    cfg = RunConfig(**{**BASE, **stop}, **STRATEGIES[label], seed=seed + repeat, repeat=repeat, label=label)
    tables = simulate(cfg, schedule_of(cfg.seed, cfg.duration_s, cfg.num_requests),
                      noise=noise if noise is not None else Timeline(()))
    end_s = float(tables.requests["arrival_time"].max()) if isinstance(length, str) else length
    return tables, end_s


@functools.lru_cache(maxsize=64)
def schedule_of(seed: int, duration_s: float, num_requests: int):
    """One repeat's schedule, the same for every strategy (built once: ShareGPT prompts are tokenized)."""
    return make_schedule(RunConfig(**{**BASE, "duration_s": duration_s, "num_requests": num_requests}, seed=seed))


def order(labels: list[str], repeat: int, how: str) -> list[str]:
    return labels[::-1] if how == "serpentine" and repeat % 2 else labels


def true_mu(label: str) -> float:
    """The noise-free saturated rate: a long run's completions over its steady span."""
    tables, end_s = run(label, 300.0, 0, 10_000)
    return ESTIMATORS["window"](tables, end_s).req_s


def study(scenario: str, design: str, seeds: int, truth: dict[str, float]) -> dict:
    repeats, duration_s, how = DESIGNS[design]
    labels = list(STRATEGIES)
    found: dict = {(e, lb): [] for e in ESTIMATORS for lb in labels[1:]}
    for seed in range(seeds):
        machine, at = timeline(scenario, seed), 0.0
        mu = {e: {lb: [] for lb in labels} for e in ESTIMATORS}
        for r in range(repeats):
            for label in order(labels, r, how):
                machine.offset_s = at
                tables, end_s = run(label, duration_s, r, seed * 100, noise=machine)
                at += float(tables.requests["completion_time"].max()) + GAP_S
                for e, estimate in ESTIMATORS.items():
                    one = estimate(tables, end_s)
                    mu[e][label].append(one.req_s if one else float("nan"))
        for e in ESTIMATORS:
            for label in labels[1:]:
                ratios = [b / a for a, b in zip(mu[e]["naive"], mu[e][label]) if a > 0 and b > 0]
                found[(e, label)].append(between_repeats(ratios) if len(ratios) >= 2 else None)
    rows = {}
    for (e, label), results in found.items():
        true_pct = 100 * (truth[label] / truth["naive"] - 1)
        ok = [r for r in results if r is not None]
        right = [r.significant and (r.estimate > 0) == (true_pct > 0) for r in ok]
        covered = [r.lo <= true_pct <= r.hi for r in ok]
        width = [r.hi - r.lo for r in ok]
        rows[(e, label)] = dict(true_pct=true_pct, significant=np.mean(right) if ok else 0.0,
                                covered=np.mean(covered) if ok else 0.0,
                                width=statistics.median(width) if ok else math.inf, missing=len(results) - len(ok))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--designs", default=",".join(DESIGNS))
    args = ap.parse_args(argv)
    truth = {label: true_mu(label) for label in STRATEGIES}
    print("noise-free μ (req/s): " + ", ".join(f"{lb} {mu:.3g}" for lb, mu in truth.items()))
    for scenario in args.scenarios.split(","):
        print(f"\n{scenario}: slow drift σ {SCENARIOS[scenario][0][0]} (τ {SCENARIOS[scenario][0][1]:g} s), fast σ "
              f"{SCENARIOS[scenario][1][0]} (τ {SCENARIOS[scenario][1][1]:g} s), neighbour "
              f"{SCENARIOS[scenario][2][0]:.0%} of the time in bursts; {args.seeds} seeds")
        print(f"{'design':>20} {'estimator':>9} " + " ".join(f"{lb + ' vs naive':>36}" for lb in list(STRATEGIES)[1:]))
        print(f"{'':>30} " + " ".join(f"{'true: significant, covered, width':>36}" for _ in list(STRATEGIES)[1:]))
        for design in args.designs.split(","):
            rows = study(scenario, design, args.seeds, truth)
            for e in ESTIMATORS:
                cells = [rows[(e, lb)] for lb in list(STRATEGIES)[1:]]
                print(f"{design:>20} {e:>9} " + " ".join(
                    f"{c['true_pct']:+5.0f}%: sig {c['significant']:4.0%} cov {c['covered']:4.0%} w {c['width']:4.0f} pp"
                    for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
