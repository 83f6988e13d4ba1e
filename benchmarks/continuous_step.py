"""Decode-step time of the continuous HF loop against static generate() on the same rows, in one process.

For each batch size × context, every round runs the same rows (random prompt ids, `--steps` tokens each)
through generate() (a stock HFBackend, SDPA attention) and through HFContinuousBackend with each KV
layout (all rows admitted at once: step 0 is their prefill). The table shows each method's fastest decode
step over all rounds (the first decode step after a prefill is skipped, as in step_time.py), since other
load on the machine only ever adds time. Rounds interleave the methods, so drift hits them alike.

    python benchmarks/continuous_step.py                      # both layouts, the default grid
    python benchmarks/continuous_step.py --layouts padded --batches 1,8 --contexts 128
"""
import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchlab.worker.backend import Row, StepOutput  # noqa: E402
from batchlab.worker.hf import HFBackend, HFSettings  # noqa: E402
from batchlab.worker.hf_continuous import HFContinuousBackend  # noqa: E402

SKIP_DECODE_STEPS = 1  # the first decode step after a prefill is not measured (step_time.py does the same)


def make_rows(batch: int, context: int, steps: int, prefix: int, spread: float, rng: random.Random) -> list[Row]:
    """`batch` rows of `context` tokens (BOS included), shorter by up to `spread` × context, `steps` out each."""
    bodies = [context - prefix - round(spread * context * i / max(batch - 1, 1)) for i in range(batch)]
    return [Row(i, n, steps, [rng.randrange(100, 32000) for _ in range(n)], 0) for i, n in enumerate(bodies)]


def generate_step_s(backend: HFBackend, rows: list[Row]) -> float:
    """Fastest decode step of one generate() run (streamer stamps: step 0 is the prefill)."""
    outs: list[StepOutput] = []
    backend.run_batch(rows, outs.append)
    return min(o.time - o.start_time for o in outs[1 + SKIP_DECODE_STEPS:])


def continuous_step_s(backend: HFContinuousBackend, rows: list[Row]) -> float:
    """Fastest decode step of the continuous loop over the same rows, admitted together."""
    backend.admit(rows)
    outs: list[StepOutput] = []
    while backend.has_work():
        outs.append(backend.step())
    return min(o.time - o.start_time for o in outs[1 + SKIP_DECODE_STEPS:])


def measure(methods: dict, rows: list[Row], rounds: int) -> dict[str, float]:
    """Fastest decode step (s) per method over `rounds` runs of `rows` each."""
    best = {name: float("inf") for name in methods}
    for _ in range(rounds):
        for name, run in methods.items():
            best[name] = min(best[name], run(rows))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-mistral")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layouts", default="padded,slots", help="continuous KV layouts to time, comma-separated")
    parser.add_argument("--batches", default="1,4,8,16,32")
    parser.add_argument("--contexts", default="128,512", help="prompt tokens per row, BOS included")
    parser.add_argument("--steps", type=int, default=10, help="tokens per row (step 0 is the prefill)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spread", type=float, default=0.0,
                        help="contexts spread evenly down to (1 − spread) × context (0: all equal, no padding)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    batches, contexts = [int(b) for b in args.batches.split(",")], [int(c) for c in args.contexts.split(",")]
    layouts = args.layouts.split(",")
    settings = HFSettings(model=args.model, device=args.device, max_batch_size=max(batches))
    static = HFBackend(settings)
    static.warmup()
    loops = {layout: HFContinuousBackend(settings, layout=layout) for layout in layouts}
    for loop in loops.values():
        loop.warmup()
    methods = {"generate": lambda rows: generate_step_s(static, rows)}
    methods |= {layout: (lambda rows, b=loop: continuous_step_s(b, rows)) for layout, loop in loops.items()}
    rng, ratios = random.Random(0), {layout: [] for layout in layouts}
    print(f"{'batch':>5} {'context':>7} " + " ".join(f"{name + ' ms':>12}" for name in methods)
          + "".join(f" {layout + '/gen':>12}" for layout in layouts), flush=True)
    for context in contexts:
        for batch in batches:
            rows = make_rows(batch, context, args.steps, len(static.prefix), args.spread, rng)
            best = measure(methods, rows, args.rounds)
            for layout in layouts:
                ratios[layout].append(best[layout] / best["generate"])
            print(f"{batch:>5} {context:>7} " + " ".join(f"{best[name] * 1e3:>12.2f}" for name in methods)
                  + "".join(f" {ratios[layout][-1]:>12.3f}" for layout in layouts), flush=True)
    for layout in layouts:
        print(f"{layout}: continuous/generate decode step ratio: median {statistics.median(ratios[layout]):.3f}, "
              f"worst {max(ratios[layout]):.3f}")


if __name__ == "__main__":
    main()
