"""Decode step time of a real model against batch size and prompt length, and the step-time model fitted to it.

Every point is a real `HFBackend.run_batch` (model.generate) whose per-step stamps are read back:
step 0 is the prefill (it yields the first token), steps 1.. are decode steps. The memory-bound model
(worker.stepmodel.StepModel) is then fitted by least squares:

    decode_step_s = overhead_s + (weights_bytes + kv_bytes_per_token × context) / bandwidth_Bps
    prefill_s     = overhead_s + weights_bytes / bandwidth_Bps + prefill_s_per_token × prompt_tokens

weights_bytes and kv_bytes_per_token are the model's own; overhead_s and bandwidth_Bps come from the
decode points (an affine fit in context), prefill_s_per_token from the prefill points.

    python benchmarks/step_time.py --out results/step_time.parquet
"""
import argparse
import random
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from batchlab.worker.backend import BackendRequest, StepOutput
from batchlab.worker.hf.static import HFBackend, HFSettings
from batchlab.worker.stepmodel import StepModel

SKIP_DECODE_STEPS = 1  # the first decode step after a prefill still pays for cache growth; not measured


@dataclass(slots=True)
class Point:
    """One measured batch shape."""

    batch_size: int
    prompt_len: int  # tokens per row, BOS included
    prefill_s: float
    decode_step_s: float  # fastest measured decode step
    context_tokens: float  # mean cached tokens (all rows) over the measured decode steps
    decode_steps: int  # decode steps measured (all repeats)


def measure(backend: HFBackend, batch_size: int, prompt_len: int, steps: int, repeats: int,
            rng: random.Random) -> Point:
    """Run a batch of `batch_size` rows × `prompt_len` tokens for `steps` tokens: once to warm the shape
    (kernels, allocator blocks), then `repeats` times. The fastest prefill and the fastest decode step count: other load on the
    machine only ever adds time, so the minimum is the estimate of the model's own cost."""
    body = prompt_len - len(backend.prefix)
    rows = [BackendRequest.new(i, body, steps, [rng.randrange(100, 32000) for _ in range(body)], 0)
            for i in range(batch_size)]
    backend.run_batch(rows, lambda _out: None)
    prefill_s, decode_s = [], []
    for _ in range(repeats):
        outs: list[StepOutput] = []
        backend.run_batch(rows, outs.append)
        prefill_s.append(outs[0].time - outs[0].start_time)
        decode_s += [o.time - o.start_time for o in outs[1 + SKIP_DECODE_STEPS:]]
    contexts = [batch_size * (prompt_len + i) for i in range(1 + SKIP_DECODE_STEPS, steps)]
    return Point(batch_size, prompt_len, min(prefill_s), min(decode_s), statistics.fmean(contexts), len(decode_s))


def fit(points: list[Point], name: str, weights_bytes: float, kv_bytes_per_token: int) -> StepModel:
    """Least squares: decode time affine in context → overhead and bandwidth; prefill slope per token."""
    xs, ys = [p.context_tokens for p in points], [p.decode_step_s for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-30)
    slope = max(slope, 1e-15)  # time per cached token (s); must be positive to give a bandwidth
    bandwidth = kv_bytes_per_token / slope
    overhead = my - slope * mx - weights_bytes / bandwidth
    if overhead < 0:  # refit with overhead 0: time = (weights + kv × context) / bandwidth, through the origin
        feats = [weights_bytes + kv_bytes_per_token * x for x in xs]
        bandwidth = sum(f * f for f in feats) / sum(f * y for f, y in zip(feats, ys))
        overhead = 0.0
    base = overhead + weights_bytes / bandwidth
    tokens = [p.batch_size * p.prompt_len for p in points]
    per_token = sum(t * (p.prefill_s - base) for t, p in zip(tokens, points)) / sum(t * t for t in tokens)
    return StepModel(name, weights_bytes, kv_bytes_per_token, bandwidth, max(per_token, 0.0), overhead)


def table(points: list[Point], model: StepModel) -> list[dict]:
    """Measured next to modelled, with relative errors."""
    rows = []
    for p in points:
        d_model = model.decode_step_s(round(p.context_tokens))
        p_model = model.prefill_s(p.batch_size * p.prompt_len)
        rows.append({**asdict(p), "model_decode_step_s": d_model, "model_prefill_s": p_model,
                     "decode_rel_err": d_model / p.decode_step_s - 1, "prefill_rel_err": p_model / p.prefill_s - 1})
    return rows


def print_table(rows: list[dict], model: StepModel) -> None:
    print(f"{'B':>3} {'P':>4} {'decode ms':>9} {'model':>7} {'err':>6}   {'prefill ms':>10} {'model':>8} {'err':>6}")
    for r in rows:
        print(f"{r['batch_size']:>3} {r['prompt_len']:>4} {1e3 * r['decode_step_s']:>9.2f} "
              f"{1e3 * r['model_decode_step_s']:>7.2f} {r['decode_rel_err']:>+6.0%}   {1e3 * r['prefill_s']:>10.1f} "
              f"{1e3 * r['model_prefill_s']:>8.1f} {r['prefill_rel_err']:>+6.0%}")
    d_err = statistics.fmean(abs(r["decode_rel_err"]) for r in rows)
    p_err = statistics.fmean(abs(r["prefill_rel_err"]) for r in rows)
    print(f"fit: overhead_s={model.overhead_s:.5f} bandwidth_Bps={model.bandwidth_Bps:.4g} "
          f"prefill_s_per_token={model.prefill_s_per_token:.4g} weights_bytes={model.weights_bytes:.4g}")
    print(f"mean |relative error|: decode {d_err:.1%}, prefill {p_err:.1%}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-mistral")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--prompt-lens", default="32,128,512")
    ap.add_argument("--max-prefill-tokens", type=int, default=2048, help="skip shapes with more B×P (CPU time)")
    ap.add_argument("--steps", type=int, default=6, help="tokens per run (1 prefill + decode steps)")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per shape (the fastest counts)")
    ap.add_argument("--name", default="cpu-tiny-mistral", help="name of the fitted StepModel")
    ap.add_argument("--out", default="", help="write the table as Parquet here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = HFBackend(HFSettings(model=args.model, device=args.device, dtype=args.dtype))
    backend.warmup()
    print(f"{args.model} on {backend.info.device}, {backend.info.facts['dtype']}: "
          f"load {backend.info.facts['load_s']:.2f} s, warm-up {backend.info.facts['warmup_s']:.2f} s")
    rng = random.Random(0)
    shapes = [(b, p) for p in map(int, args.prompt_lens.split(",")) for b in map(int, args.batch_sizes.split(","))
              if b * p <= args.max_prefill_tokens]
    points = [measure(backend, b, p + len(backend.prefix), args.steps, args.repeats, rng) for b, p in shapes]
    weights_bytes = backend.info.facts["n_params"] * backend.model.dtype.itemsize
    model = fit(points, args.name, weights_bytes, backend.info.kv_bytes_per_token)
    rows = table(points, model)
    print_table(rows, model)
    if args.out:
        import pandas as pd

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame(rows).assign(model=args.model, device=backend.info.device, dtype=backend.info.facts["dtype"])
        frame.to_parquet(args.out, index=False)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
