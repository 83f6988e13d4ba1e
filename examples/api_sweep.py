"""A small sweep from Python: two strategies × two rates on the sim backend (no model, a few seconds a
point), then its figures read back and printed. Run: python examples/api_sweep.py [OUT]"""
import sys

from batchlab import api

PLAN = {  # what a sweep YAML holds (configs/smoke.yaml is one), as a mapping
    "base": {"backend": "sim", "preset": "cpu-tiny-mistral", "dataset": "synthetic", "duration_s": 2,
             "max_new_tokens": 16, "max_prompt_len": 128, "batch_size": 4, "max_batch_size": 8,
             "max_wait_ms": 50, "warmup_requests": 0},
    "grid": {"strategies": ["naive", "dynamic"], "rates": [4, 8], "repeats": 1, "seed": 0},
}


def main(out: str) -> api.SweepResult:
    """Sweep PLAN into `out`, print one row per point and the report's headlines; the result."""
    result = api.sweep(PLAN, out, resume=False)
    print(f"{result.measured} of {len(result.records)} points measured in {result.out}")
    print(f"{'strategy':<10} {'rate':>5} {'finished':>8} {'tok/s':>8} {'TTFT p50 ms':>12}")
    for key, summary in result.summaries().items():
        print(f"{key.label:<10} {key.rate:>5g} {summary.finished:>8} {summary.throughput_tok_s:>8.0f} "
              f"{summary.ttft.p50 * 1e3:>12.1f}")
    for line in result.report().headlines:
        print(f"- {line}")
    return result


if __name__ == "__main__":  # runs start their processes with spawn: the guard keeps them from re-running main
    main(sys.argv[1] if len(sys.argv) > 1 else "results/api-sweep")
