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
    python benchmarks/sim_fidelity.py --runs results/sim_fidelity --preset ...   # re-score saved live runs

The error is split by cause: each live run's own recorded batches and steps replayed through the step
model (simulator.replay: the step model's error alone) beside the full simulation of the same
schedule (which adds the scheduling model's error). Per point and headline metric the table gives the
real value, the replay's and the simulation's, the step model's error (replay ÷ real − 1), the
scheduling model's (simulation ÷ replay − 1) and the total (simulation ÷ real − 1).
"""
import argparse
import json
import statistics
from pathlib import Path

from batchlab import api
from batchlab.collector.layout import point_of
from batchlab.collector.parts import read_schedule
from batchlab.collector.summary import Summary, read_summary
from batchlab.protocol.settings import RunConfig, vllm_rule
from batchlab.report.text import sig3
from batchlab.simulator.fidelity import config_from_settings
from batchlab.simulator.replay import replay
from batchlab.simulator.run import simulate
from batchlab.traffic.schedule import Schedule
from batchlab.worker.run_steps import read_run_steps
from batchlab.worker.stepmodel import get_preset

METRICS = {"ttft_p50": ("ttft", "p50"), "ttft_p99": ("ttft", "p99"), "e2e_p50": ("e2e", "p50"),
           "tpot_p50": ("tpot", "p50"), "throughput": ("throughput_tok_s", None)}
HEADLINE = ("ttft_p50", "e2e_p50", "throughput")  # the simulator's target: median error ≤ 10%, none worse than 25%
STRATEGIES = {"naive": ("naive", "hf", "preset"), "dynamic": ("dynamic", "hf", "preset"),
              "continuous": ("continuous", "hf", "loop_preset"), "vllm": ("vllm", "vllm", "vllm_preset")}


def base_config(args: argparse.Namespace) -> RunConfig:
    """configs/cpu.yaml's workload: tiny-mistral on the CPU, ShareGPT prompts ≤ 256, 32-token outputs."""
    return RunConfig(model="tiny-mistral", device="cpu", dataset="sharegpt", arrival="poisson",
                     duration_s=args.duration, max_new_tokens=32, max_prompt_len=256, batch_size=8,
                     max_batch_size=8, max_wait_ms=200, max_queue=16, seed=args.seed)


def value(summary: Summary, metric: str) -> float | None:
    key, q = METRICS[metric]
    v = getattr(summary, key)
    return getattr(v, q) if q else v


def run_point(label: str, rate: float, preset: str, args: argparse.Namespace) -> dict:
    """The real run, then its replay and the simulator on its saved schedule; see evaluate_run."""
    strategy, backend, _ = STRATEGIES[label]
    out = Path(args.out) / label / f"rate-{rate:g}"
    extra = {"memory_budget": "1GiB", "max_num_seqs": 8} if backend == "vllm" else {}
    cfg = base_config(args).model_copy(update=dict(strategy=strategy, backend=backend, rate=rate, out=str(out),
                                                   **extra))
    live = api.run(cfg, overwrite=True)
    return evaluate_run(out, label, cfg, live, preset)


def evaluate_run(out: Path, label: str, cfg: RunConfig, live: Summary, preset: str) -> dict:
    """A finished live run (folder `out`, its config and summary) against its replay through `preset` and
    the full simulation of its schedule: each one's figures and the three errors per metric."""
    frame = read_schedule(out)
    schedule = Schedule(frame, "", float(frame["arrival_offset_s"].max()))
    sim_strategy = vllm_rule(cfg.strategy, cfg.backend)[0]  # vLLM's worker is fed by credit
    sim = simulate(cfg.model_copy(update=dict(backend="sim", preset=preset, strategy=sim_strategy)), schedule).summary
    model = get_preset(preset)
    replayed = replay(read_run_steps(out, model.padded, model.fused), model)
    figures = {"real": live, "replay": Summary.model_validate(replayed), "sim": sim}
    point = {"label": label, "rate": cfg.rate, "finished": live.finished, "submitted": live.submitted,
             **{k: {m: value(v, m) for m in METRICS} for k, v in figures.items()}}
    point.update(split_errors(point))
    return point


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not b or a is None else a / b - 1


def split_errors(point: dict) -> dict:
    """{"error": total, "step_error": replay ÷ real − 1, "schedule_error": sim ÷ replay − 1}, per metric."""
    real, rep, sim = point["real"], point["replay"], point["sim"]
    return {"error": {m: _ratio(sim[m], real[m]) for m in METRICS},
            "step_error": {m: _ratio(rep[m], real[m]) for m in METRICS},
            "schedule_error": {m: _ratio(sim[m], rep[m]) for m in METRICS}}


def split_table(points: list[dict]) -> str:
    """The split by cause as a text table: a row per point and headline metric."""
    head = f"{'strategy':<11}{'rate':>6}  {'metric':<11}{'real':>9}{'replay':>9}{'sim':>9}" \
           f"{'step model':>12}{'scheduling':>12}{'total':>9}"
    lines = [head, "-" * len(head)]
    for p in points:
        for m in HEADLINE:
            lines.append(f"{p['label']:<11}{p['rate']:>6g}  {m:<11}{sig3(p['real'][m]):>9}{sig3(p['replay'][m]):>9}"
                         f"{sig3(p['sim'][m]):>9}{_pct(p['step_error'][m]):>12}{_pct(p['schedule_error'][m]):>12}"
                         f"{_pct(p['error'][m]):>9}")
    return "\n".join(lines)


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def print_point(p: dict) -> None:
    cells = "  ".join(f"{m} {_pct(e)} ({sig3(p['real'][m])}→{sig3(p['sim'][m])})"
                      for m, e in p["error"].items())
    print(f"{p['label']:<11} {p['rate']:>5g} req/s  {p['finished']}/{p['submitted']}  {cells}", flush=True)


def overall(points: list[dict], key: str = "error") -> tuple[float, float]:
    """Median and worst |relative error| (`key`: error, step_error or schedule_error) over the headline
    metrics of every point."""
    errs = [abs(p[key][m]) for p in points for m in HEADLINE if p[key][m] is not None]
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
    ap.add_argument("--runs", default="", help="re-score the live runs saved in this folder (LABEL/rate-R/, "
                                               "as this script writes them) instead of running new ones")
    args = ap.parse_args(argv)
    if args.quick:
        args.strategies, args.rates, args.duration = "dynamic,continuous", args.rates.split(",")[1], 8.0
    args.loop_preset = args.loop_preset or args.preset
    return args


def saved_points(folder: Path, args: argparse.Namespace) -> list[dict]:
    """Every saved live run under `folder` (LABEL/rate-R/, or a sweep's points, with summary.json), re-scored
    with `args`' presets."""
    points = []
    found = sorted([*folder.glob("*/rate-*/summary.json"), *folder.glob("*/rate-*/rep-*/summary.json"),
                    *folder.glob("sweep_label=*/sweep_rate=*/sweep_repeat=*/summary.json")])
    for summary_file in found:  # this script's LABEL/rate-R/, or a sweep's point (either layout)
        run = summary_file.parent
        point = point_of(run)
        label = point[0] if point else run.parent.name
        preset = getattr(args, STRATEGIES[label][2]) if label in STRATEGIES else args.preset
        if not preset:
            print(f"{label}: skipped (no calibrated preset)")
            continue
        live = read_summary(run)  # the run's settings (as recorded) give its RunConfig
        points.append(evaluate_run(run, label, config_from_settings(live.settings), live, preset))
        print_point(points[-1])
    return points


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points = saved_points(Path(args.runs), args) if args.runs else []
    for label in [] if args.runs else args.strategies.split(","):
        preset = getattr(args, STRATEGIES[label][2])
        if not preset:
            print(f"{label}: skipped (no calibrated preset)")
            continue
        for rate in map(float, args.rates.split(",")):
            points.append(run_point(label, rate, preset, args))
            print_point(points[-1])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "fidelity.json").write_text(json.dumps(points, indent=2))
    print(split_table(points))
    for key, name in (("step_error", "step model alone (replay)"), ("error", "simulator error vs real runs")):
        median, worst = overall(points, key)
        print(f"{name}: median {median:.0%}, worst {worst:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
