"""The simulator against real runs: the same saved schedule played by the real worker and by
`batchlab simulate` with a calibrated preset (`batchlab calibrate --out PRESET.yaml`).

Per point (strategy × rate) it prints the simulator's relative error (simulated ÷ real − 1) of TTFT p50
and p99, E2E p50, TPOT p50 and throughput, then, last, `simulator error vs real runs: median M%,
worst W%` over the headline metrics (TTFT p50, E2E p50, throughput) of every point.

    batchlab calibrate --backend hf --model tiny-mistral --device cpu --out presets/hf.yaml
    batchlab calibrate --backend hf --mode continuous --model tiny-mistral --device cpu --out presets/hf-loop.yaml
    batchlab calibrate --backend vllm --model tiny-mistral --out presets/vllm.yaml
    python benchmarks/sim_fidelity.py --preset presets/hf.yaml --loop-preset presets/hf-loop.yaml \
        --vllm-preset presets/vllm.yaml --rates 2,4,6
    python benchmarks/sim_fidelity.py --quick --preset presets/hf.yaml        # 1 rate, 2 strategies, short
"""
import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchlab.cli.launcher import launch_run  # noqa: E402
from batchlab.collector.parts import read_schedule  # noqa: E402
from batchlab.protocol.settings import RunConfig  # noqa: E402
from batchlab.scheduler.simulator.run import simulate  # noqa: E402
from batchlab.traffic.schedule import Schedule  # noqa: E402

METRICS = {"ttft_p50": ("ttft", "p50"), "ttft_p99": ("ttft", "p99"), "e2e_p50": ("e2e", "p50"),
           "tpot_p50": ("tpot", "p50"), "throughput": ("throughput_tok_s", None)}
HEADLINE = ("ttft_p50", "e2e_p50", "throughput")  # the goal: median ≤ 10%, none worse than 25%
STRATEGIES = {"naive": ("naive", "hf", "preset"), "dynamic": ("dynamic", "hf", "preset"),
              "continuous": ("continuous", "hf", "loop_preset"), "vllm": ("vllm", "vllm", "vllm_preset")}


def base_config(args: argparse.Namespace) -> RunConfig:
    """configs/cpu.yaml's workload: tiny-mistral on the CPU, ShareGPT prompts ≤ 256, 32-token outputs."""
    return RunConfig(model="tiny-mistral", device="cpu", dataset="sharegpt", arrival="poisson",
                     duration_s=args.duration, max_new_tokens=32, max_prompt_len=256, batch_size=8,
                     max_batch_size=8, max_wait_ms=200, max_queue=16, seed=args.seed)


def value(summary: dict, metric: str) -> float | None:
    key, q = METRICS[metric]
    v = summary.get(key)
    return v.get(q) if isinstance(v, dict) else v


def run_point(label: str, rate: float, preset: str, args: argparse.Namespace) -> dict:
    """The real run, then the simulator on its saved schedule; relative errors per metric."""
    strategy, backend, _ = STRATEGIES[label]
    out = Path(args.out) / label / f"rate-{rate:g}"
    extra = {"memory_budget": "1GiB", "max_num_seqs": 8} if backend == "vllm" else {}
    cfg = replace(base_config(args), strategy=strategy, backend=backend, rate=rate, out=str(out), **extra)
    live = launch_run(cfg)
    frame = read_schedule(out)
    schedule = Schedule(frame, "", float(frame["arrival_offset_s"].max()))
    sim_strategy = "continuous" if strategy == "vllm" else strategy  # the credit policy vLLM's worker is fed by
    sim = simulate(replace(cfg, backend="sim", preset=preset, strategy=sim_strategy), schedule).summary
    errors = {}
    for m in METRICS:
        real, pred = value(live, m), value(sim, m)
        errors[m] = None if not real or pred is None else pred / real - 1
    return {"label": label, "rate": rate, "finished": live.get("finished"), "submitted": live.get("submitted"),
            "real": {m: value(live, m) for m in METRICS}, "sim": {m: value(sim, m) for m in METRICS},
            "error": errors}


def print_point(p: dict) -> None:
    cells = "  ".join(f"{m} {'-' if e is None else f'{e:+.1%}'} ({_fmt(p['real'][m])}→{_fmt(p['sim'][m])})"
                      for m, e in p["error"].items())
    print(f"{p['label']:<11} {p['rate']:>5g} req/s  {p['finished']}/{p['submitted']}  {cells}", flush=True)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def overall(points: list[dict]) -> tuple[float, float]:
    """Median and worst |relative error| over the headline metrics of every point."""
    errs = [abs(p["error"][m]) for p in points for m in HEADLINE if p["error"][m] is not None]
    return (statistics.median(errs), max(errs)) if errs else (float("nan"), float("nan"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True, help="calibrated preset of the static HF worker (naive, dynamic)")
    ap.add_argument("--loop-preset", default="", help="calibrated preset of the HF continuous loop (default --preset)")
    ap.add_argument("--vllm-preset", default="", help="calibrated preset of vLLM (vllm is skipped without one)")
    ap.add_argument("--strategies", default="naive,dynamic,continuous,vllm")
    ap.add_argument("--rates", default="2,4,6", help="requests/s around the knee (below, near, above)")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of traffic per point")
    ap.add_argument("--quick", action="store_true", help="one rate, dynamic and continuous, 8 s of traffic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/sim_fidelity")
    args = ap.parse_args(argv)
    if args.quick:
        args.strategies, args.rates, args.duration = "dynamic,continuous", args.rates.split(",")[1], 8.0
    args.loop_preset = args.loop_preset or args.preset
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points = []
    for label in args.strategies.split(","):
        preset = getattr(args, STRATEGIES[label][2])
        if not preset:
            print(f"{label}: skipped (no calibrated preset)")
            continue
        for rate in map(float, args.rates.split(",")):
            points.append(run_point(label, rate, preset, args))
            print_point(points[-1])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fidelity.json").write_text(json.dumps(points, indent=2))
    median, worst = overall(points)
    print(f"simulator error vs real runs: median {median:.0%}, worst {worst:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
