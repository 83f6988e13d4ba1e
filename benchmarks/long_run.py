"""Memory of a long run: an echo run of N token rows, each role's RSS sampled from outside.

    .venv/bin/python benchmarks/long_run.py [--rows 5000000] [--rate 200] [--output-len 500]
        [--prompt-len 128] [--strategy continuous] [--out results/long_run]

The run's duration is chosen so that rate × duration × output-len ≈ rows (an hour at 100 req/s with
500-token outputs is --rows 18000000 --rate 100). It runs `api.run` (traffic, scheduler, echo
worker, collector as spawn processes); a thread reads each role's resident set every SAMPLE_S (the
kernel's high-water mark, VmHWM, where /proc has it, so a short peak between samples still counts).
It prints each role's peak RSS (the launcher's, this process's, and `batchlab report OUT`'s after the run
too), the collector's final write time (from the last other role's exit to its own) and, last, `collector
peak RSS: X MiB for N token rows`. Written as OUT/long_run.json.
Figures are printed, never asserted.
"""
import argparse
import json
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from batchlab import api
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.settings import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ as run from the repository root
from soak_memory import command_peak_mib  # noqa: E402  (the report's peak, as the soak measures it)

SAMPLE_S = 0.1
MIB = 1 << 20


def _peak_rss_bytes(proc: psutil.Process) -> int:
    """The process's peak RSS so far (VmHWM), else its current RSS."""
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return proc.memory_info().rss


class RssSampler(threading.Thread):
    """Samples every role's peak RSS and notes when each was last seen alive (monotonic s)."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(daemon=True)
        self.pids_file = RunDir(out_dir).pids
        self.peak: dict[str, int] = {}
        self.last_seen_s: dict[str, float] = {}
        self.series: dict[str, list[tuple[float, int]]] = {}  # role -> [(s since start, rss bytes)]
        self.done = threading.Event()

    def run(self) -> None:
        procs: dict[str, psutil.Process] = {}
        start = time.monotonic()
        while not self.done.is_set():
            if not procs and self.pids_file.exists():
                procs = {r: psutil.Process(p) for r, p in json.loads(self.pids_file.read_text()).items()}
            for role, proc in procs.items():
                try:
                    peak, rss = _peak_rss_bytes(proc), proc.memory_info().rss
                except psutil.Error:  # exited: its last sample stands
                    continue
                t = time.monotonic()
                self.peak[role] = max(self.peak.get(role, 0), peak)
                self.last_seen_s[role] = t
                self.series.setdefault(role, []).append((round(t - start, 2), rss))
            time.sleep(SAMPLE_S)


def config(args: argparse.Namespace) -> RunConfig:
    """The echo run that produces about args.rows token rows."""
    duration_s = args.rows / (args.rate * args.output_len)
    return RunConfig(strategy=args.strategy, backend="echo", dataset="synthetic", rate=args.rate,
                     duration_s=duration_s, arrival="poisson", max_new_tokens=args.output_len,
                     prompt_lengths=str(args.prompt_len), output_lengths=str(args.output_len),
                     max_prompt_len=max(args.prompt_len, 1024), max_batch_size=args.max_batch_size,
                     seed=args.seed, out=str(args.out)).validate()


def run(args: argparse.Namespace) -> dict:
    """One long run; its figures."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    RunDir(out).pids.unlink(missing_ok=True)
    cfg = config(args)
    sampler = RssSampler(out)
    sampler.start()
    t_launch = time.monotonic()
    summary = api.run(cfg, overwrite=True)
    t_end = time.monotonic()
    sampler.done.set()
    sampler.join()
    others = [t for role, t in sampler.last_seen_s.items() if role != "collector"]
    rows = pq.read_metadata(RunDir(out).table("tokens")).num_rows
    sampler.peak["launcher"] = _peak_rss_bytes(psutil.Process())  # this process ran api.run: its high-water mark
    sampler.peak["report"] = int(command_peak_mib([sys.executable, "-m", "batchlab.cli.main", "report", str(out)])[0]
                                 * MIB)
    return {
        "token_rows": rows, "requests": summary.scheduled, "finished": summary.finished,
        "duration_s": cfg.duration_s, "rate": cfg.rate, "output_len": args.output_len,
        "launch_to_last_file_s": t_end - t_launch,
        "final_write_s": sampler.last_seen_s.get("collector", t_end) - max(others, default=t_end),
        "peak_rss_mib": {role: b / MIB for role, b in sampler.peak.items()},
        "rss_series": sampler.series,
    }


def report(fig: dict) -> None:
    """The figures; the collector's peak last."""
    print(f"{fig['requests']} requests ({fig['finished']} finished), {fig['token_rows']} token rows, "
          f"{fig['duration_s']:.1f} s of traffic at {fig['rate']:g} req/s × {fig['output_len']} tokens")
    print(f"launch to last file: {fig['launch_to_last_file_s']:.1f} s; "
          f"collector's final write: {fig['final_write_s']:.1f} s")
    for role, mib in sorted(fig["peak_rss_mib"].items()):
        print(f"  {role:<10} peak RSS {mib:8.1f} MiB")
    peak = fig["peak_rss_mib"]
    print(f"traffic peak RSS: {peak.get('traffic', float('nan')):.0f} MiB for {fig['requests']} requests")
    print(f"collector peak RSS: {peak.get('collector', float('nan')):.0f} MiB for {fig['token_rows']} token rows")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5_000_000, help="token rows to produce (about)")
    p.add_argument("--rate", type=float, default=200.0, help="requests/s")
    p.add_argument("--output-len", type=int, default=500, help="tokens per request")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--strategy", default="continuous")
    p.add_argument("--max-batch-size", type=int, default=256, help="worker rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/long_run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run, print, and write OUT/long_run.json."""
    args = parse_args(argv)
    fig = run(args)
    (Path(args.out) / "long_run.json").write_text(json.dumps(fig, indent=2))
    report(fig)
    return fig


if __name__ == "__main__":
    main()
