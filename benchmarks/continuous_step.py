"""Decode-step time of the continuous HF loop against static generate() on the same rows, in one process.

For each batch size × context, every round runs the same rows (random prompt ids, `--steps` tokens each)
through generate() (a stock HFBackend, SDPA attention) and through HFContinuousBackend with each KV
layout (all rows admitted at once: step 0 is their prefill). The table shows each method's fastest decode
step over all rounds (the first decode step after a prefill is skipped, as in step_time.py), since other
load on the machine only ever adds time. Rounds interleave the methods, so drift hits them alike.

Then the prefill stall: `--stall-rows` rows decode while one `--stall-prompt`-token prompt joins; the figure
is the longest gap between two tokens of a running row from the join to the joiner's first token, with the
whole prompt prefilled in one step and with chunked prefill (`--stall-budget` tokens per step), each with
the running rows' decodes and the prompt's chunk in one fused forward (the default) and in two forwards, the
smallest over the rounds; also the joiner's time to first token and the time the running rows took to
finish (what chunking costs them, if anything).

    python benchmarks/continuous_step.py                      # both layouts, the default grid, the stall
    python benchmarks/continuous_step.py --layouts padded --batches 1,8 --contexts 128
    python benchmarks/continuous_step.py --batches "" --stall-budget 128,256,512   # only the stall
"""
import argparse
import random
import statistics
from dataclasses import astuple, dataclass

from batchlab.protocol.clock import now
from batchlab.worker.backend import BackendRequest, StepOutput
from batchlab.worker.hf.continuous import HFContinuousBackend
from batchlab.worker.hf.static import HFBackend, HFSettings

SKIP_DECODE_STEPS = 1  # the first decode step after a prefill is not measured (step_time.py does the same)


def make_rows(batch: int, context: int, steps: int, prefix: int, spread: float,
              rng: random.Random) -> list[BackendRequest]:
    """`batch` rows of `context` tokens (BOS included), shorter by up to `spread` × context, `steps` out each."""
    bodies = [context - prefix - round(spread * context * i / max(batch - 1, 1)) for i in range(batch)]
    return [BackendRequest.new(i, n, steps, [rng.randrange(100, 32000) for _ in range(n)], 0)
            for i, n in enumerate(bodies)]


def generate_step_s(backend: HFBackend, rows: list[BackendRequest]) -> float:
    """Fastest decode step of one generate() run (streamer stamps: step 0 is the prefill)."""
    outs: list[StepOutput] = []
    backend.run_batch(rows, outs.append)
    return min(o.time - o.start_time for o in outs[1 + SKIP_DECODE_STEPS:])


def continuous_step_s(backend: HFContinuousBackend, rows: list[BackendRequest]) -> float:
    """Fastest decode step of the continuous loop over the same rows, admitted together."""
    backend.admit(rows)
    outs: list[StepOutput] = []
    while backend.has_work():
        outs.append(backend.step())
    return min(o.time - o.start_time for o in outs[1 + SKIP_DECODE_STEPS:])


@dataclass(slots=True)
class Stall:
    """One run of running rows while a long prompt joins (seconds)."""

    longest_gap_s: float  # between two tokens of a running row, from the join to the joiner's first token
    ttft_s: float  # the joiner's admission → its first token
    running_done_s: float  # the join → the last running row's last token


def stall_run(loop: HFContinuousBackend, running: list[BackendRequest], joiner: BackendRequest,
              warm_steps: int) -> Stall:
    """`running` decode for `warm_steps` steps, then `joiner` is admitted; step until all are done."""
    loop.admit(running)
    for _ in range(warm_steps):
        loop.step()
    joined_at, times = now(), {r.request_id: [] for r in running + [joiner]}
    loop.admit([joiner])
    while loop.has_work():
        out = loop.step()
        for rid, t in zip(out.request_ids, out.times):
            times[rid].append(t)
    first = times[joiner.request_id][0]
    gaps = [b - a for r in running for a, b in zip(times[r.request_id], times[r.request_id][1:])
            if a < first and b > joined_at]
    gaps += [times[r.request_id][0] - joined_at for r in running]  # the first token after the join
    return Stall(max(gaps), first - joined_at, max(times[r.request_id][-1] for r in running) - joined_at)


def measure_stall(loop: HFContinuousBackend, args, prefix: int, budgets: list[int | None]) -> dict:
    """Per (budget, fused) (budget None: the prompt whole; fused: the decodes and the chunk in one forward, the
    default, else a decode forward and a prefill forward), each Stall figure's smallest over `args.rounds`
    interleaved runs."""
    rng, best = random.Random(1), {}
    running = make_rows(args.stall_rows, 128, 64, prefix, 0.0, rng)
    joiner = make_rows(1, args.stall_prompt, 4, prefix, 0.0, rng)[0]
    joiner.request_id = len(running)
    for _ in range(args.rounds):
        for key in [(budget, fuse) for budget in budgets for fuse in (True, False)]:
            loop.budget, loop.fuse = key
            run = stall_run(loop, running, joiner, warm_steps=4)
            old = best.get(key, run)
            best[key] = Stall(*(min(a, b) for a, b in zip(astuple(old), astuple(run))))
    loop.fuse = True
    return best


def measure(methods: dict, rows: list[BackendRequest], rounds: int) -> dict[str, float]:
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
    parser.add_argument("--no-pad-head", action="store_true",
                        help="the LM head at the real row count (default: padded to its fastest, worker.hf.head)")
    parser.add_argument("--stall-prompt", type=int, default=1024, help="the joining prompt's tokens (0: no stall)")
    parser.add_argument("--stall-rows", type=int, default=4, help="rows running (128-token contexts) as it joins")
    parser.add_argument("--stall-budget", default="256", help="chunked prefill's tokens per step, comma-separated")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    contexts = [int(c) for c in args.contexts.split(",")]
    layouts = args.layouts.split(",")
    settings = HFSettings(model=args.model, device=args.device, max_batch_size=max(batches + [args.stall_rows + 1]),
                          pad_head=not args.no_pad_head)
    static = HFBackend(settings)
    static.warmup()
    loops = {layout: HFContinuousBackend(settings, layout=layout) for layout in set(layouts) | {"slots"}}
    for loop in loops.values():
        loop.warmup()
    ratios = step_grid(static, {layout: loops[layout] for layout in layouts}, batches, contexts, args)
    if args.stall_prompt:
        budgets = [None] + [int(b) for b in args.stall_budget.split(",")]
        print_stall(measure_stall(loops["slots"], args, len(static.prefix), budgets), args)
    for layout, values in ratios.items():
        print(f"{layout}: continuous/generate decode step ratio: median {statistics.median(values):.3f}, "
              f"worst {max(values):.3f}")


def step_grid(static: HFBackend, loops: dict, batches: list[int], contexts: list[int], args) -> dict:
    """Print the decode-step table; each layout's continuous/generate ratios (none without batches)."""
    for loop in loops.values():
        loop.budget = None  # rows admitted together are prefilled whole in step 0; decode steps are timed
    methods = {"generate": lambda rows: generate_step_s(static, rows)}
    methods |= {layout: (lambda rows, b=loop: continuous_step_s(b, rows)) for layout, loop in loops.items()}
    rng, ratios = random.Random(0), {layout: [] for layout in loops}
    print(f"{'batch':>5} {'context':>7} " + " ".join(f"{name + ' ms':>12}" for name in methods)
          + "".join(f" {layout + '/gen':>12}" for layout in loops), flush=True)
    for context in contexts:
        for batch in batches:
            rows = make_rows(batch, context, args.steps, len(static.prefix), args.spread, rng)
            best = measure(methods, rows, args.rounds)
            for layout in loops:
                ratios[layout].append(best[layout] / best["generate"])
            print(f"{batch:>5} {context:>7} " + " ".join(f"{best[name] * 1e3:>12.2f}" for name in methods)
                  + "".join(f" {ratios[layout][-1]:>12.3f}" for layout in loops), flush=True)
    return {layout: values for layout, values in ratios.items() if values}


def print_stall(best: dict, args) -> None:
    """One line per budget: the longest gap a running row saw, the joiner's TTFT, the running rows' finish."""
    print(f"prefill stall: {args.stall_rows} rows running (128-token contexts) while a {args.stall_prompt}-token "
          "prompt joins (fastest of the rounds)")
    for (budget, fuse), s in best.items():
        name = ("whole prompt" if budget is None else f"chunks, {budget} tokens/step") + (
            ", fused" if fuse else ", separate")
        print(f"  {name:>36}: longest running-row gap {s.longest_gap_s * 1e3:8.1f} ms, joiner TTFT "
              f"{s.ttft_s * 1e3:8.1f} ms, running rows done after {s.running_done_s * 1e3:8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
