"""The same work on the hf backend (one static generate() batch) and the vllm backend (all rows admitted at
once, engine stepped to the end): start time, wall time, output tokens/s, mean TTFT and TPOT.

Rows are seeded random token ids (no tokenizer), greedy, exactly `--output-len` tokens each.

    python benchmarks/compare_cpu.py --rows 16 --prompt-len 64 --output-len 64 [--json out.json]
"""
import argparse
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.clock import now  # noqa: E402
from worker.backend import Row, StepOutput  # noqa: E402


@dataclass(slots=True)
class Result:
    """One backend's numbers for the shared workload."""

    backend: str
    dtype: str
    start_s: float
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    ttft_mean_s: float
    tpot_mean_s: float


def make_rows(n: int, prompt_len: int, output_len: int, seed: int = 0) -> list[Row]:
    """`n` rows of random ids in [100, 32000)."""
    rng = random.Random(seed)
    return [Row(i, prompt_len, output_len, [rng.randrange(100, 32000) for _ in range(prompt_len)], 0)
            for i in range(n)]


def summarize(name: str, dtype: str, start_s: float, t0: float, outs: list[StepOutput]) -> Result:
    """Per-request TTFT (from t0) and TPOT from the step stamps."""
    stamps: dict[int, list[float]] = {}
    for out in outs:
        for rid in out.request_ids:
            stamps.setdefault(rid, []).append(out.time)
    ttft = [s[0] - t0 for s in stamps.values()]
    tpot = [(s[-1] - s[0]) / (len(s) - 1) for s in stamps.values() if len(s) > 1]
    wall = max(s[-1] for s in stamps.values()) - t0
    n_tokens = sum(len(s) for s in stamps.values())
    return Result(name, dtype, round(start_s, 2), round(wall, 3), n_tokens, round(n_tokens / wall, 1),
                  round(statistics.fmean(ttft), 4), round(statistics.fmean(tpot) if tpot else 0.0, 4))


def timed(build: Callable[[], object]) -> tuple[object, float]:
    """(backend, seconds to build and warm it up)."""
    t = now()
    backend = build()
    backend.warmup()
    return backend, now() - t


def run_hf(rows: list[Row], args) -> Result:
    """One static batch through model.generate()."""
    from worker.hf import HFBackend, HFSettings

    backend, start_s = timed(lambda: HFBackend(HFSettings(model=args.model, dtype=args.dtype,
                                                          max_batch_size=len(rows))))
    outs: list[StepOutput] = []
    t0 = now()
    backend.run_batch(rows, outs.append)
    dtype = str(backend.info.facts.get("dtype", args.dtype))
    backend.close()
    return summarize("hf", dtype, start_s, t0, outs)


def run_vllm(rows: list[Row], args) -> Result:
    """All rows admitted at once; vLLM batches and pages them itself."""
    from worker.vllm_engine import VLLMBackend, VLLMSettings

    settings = VLLMSettings(model=args.model, dtype=args.dtype, max_num_seqs=len(rows),
                            enforce_eager=args.enforce_eager, kv_cache_bytes=2**30)
    backend, start_s = timed(lambda: VLLMBackend(settings))
    outs: list[StepOutput] = []
    t0 = now()
    backend.admit(rows)
    while backend.has_work():
        out = backend.step()
        if out is not None:
            outs.append(out)
    dtype = backend.info.facts["dtype"]
    backend.close()
    return summarize("vllm", dtype, start_s, t0, outs)


def main() -> None:
    """Parse options, run each backend on the same rows, print a table (and JSON)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-mistral")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--backends", default="hf,vllm")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--json", default="")
    args = p.parse_args()
    rows = make_rows(args.rows, args.prompt_len, args.output_len)
    runners = {"hf": run_hf, "vllm": run_vllm}
    results = [runners[name](rows, args) for name in args.backends.split(",")]
    for r in results:
        print("  ".join(f"{k}={v}" for k, v in asdict(r).items()))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
