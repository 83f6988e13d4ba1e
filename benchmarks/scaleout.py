"""Throughput with 1, 2, 4 `sim` workers on the same trace at a saturating rate.

    .venv/bin/python benchmarks/scaleout.py [--workers 1,2,4] [--rate 200] [--duration 2]
        [--strategy continuous] [--out results/scaleout]

One schedule is built once and replayed by every run (`api.run` with workers=N, same seed), so
the runs differ only in the worker count. Prints requests/s, output tokens/s, the speed-up over the
first row and the TTFT p50/p99; writes OUT/scaleout.json. Timings are printed, never asserted.
"""
import argparse
import json
from pathlib import Path

from batchlab.protocol.settings import RunConfig
from batchlab import api
from batchlab.traffic.run_schedule import make_schedule
from batchlab.traffic.schedule import save_schedule


def base_config(args: argparse.Namespace) -> RunConfig:
    """The run every worker count shares."""
    return RunConfig(strategy=args.strategy, backend="sim", preset=args.preset, dataset="synthetic",
                     rate=args.rate, duration_s=args.duration, max_new_tokens=args.max_new_tokens,
                     max_batch_size=args.max_batch_size, seed=args.seed, out=args.out).validate()


def run_workers(base: RunConfig, workers: int) -> dict:
    """One run with `workers` sim workers; its row."""
    cfg = base.model_copy(update=dict(workers=workers, out=str(Path(base.out) / f"workers-{workers}")))
    s = api.run(cfg, overwrite=True)
    fidelity = s.timing_fidelity or {}  # post-processing: the simulator on the same schedule
    return {"workers": workers, "submitted": s.submitted, "finished": s.finished, "requests_per_s": s.requests_per_s,
            "throughput_tok_s": s.throughput_tok_s, "window_s": s.window_s, "ttft_p50_s": s.ttft.p50,
            "ttft_p99_s": s.ttft.p99, "ttft_error_p50_s": (fidelity.get("ttft_error_s") or {}).get("p50")}


def print_table(rows: list[dict]) -> None:
    """One line per worker count."""
    print(f"{'workers':>7} {'finished':>8} {'req/s':>8} {'tok/s':>9} {'speed-up':>8} {'ttft p50':>9} "
          f"{'p99':>8} {'ttft err p50':>12}")
    first = rows[0]["requests_per_s"] or float("nan")
    for r in rows:
        err = r["ttft_error_p50_s"]
        print(f"{r['workers']:>7} {r['finished']:>8} {r['requests_per_s']:>8.1f} {r['throughput_tok_s']:>9.0f} "
              f"{r['requests_per_s'] / first:>8.2f} {r['ttft_p50_s']:>8.3f}s {r['ttft_p99_s']:>7.3f}s "
              f"{'' if err is None else f'{1000 * err:.2f} ms':>12}")


def main(argv: list[str] | None = None) -> list[dict]:
    """Build the trace, run each worker count on it, print and write the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--rate", type=float, default=200.0, help="requests/s (above the ~100/s 4 workers serve)")
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--strategy", default="continuous")
    p.add_argument("--preset", default="a100-llama2-7b")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/scaleout")
    args = p.parse_args(argv)
    base = base_config(args)
    trace = Path(args.out) / "trace.parquet"
    trace.parent.mkdir(parents=True, exist_ok=True)
    save_schedule(make_schedule(base), trace)
    base = base.model_copy(update=dict(schedule=str(trace)))
    rows = [run_workers(base, int(n)) for n in args.workers.split(",")]
    print_table(rows)
    (Path(args.out) / "scaleout.json").write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
