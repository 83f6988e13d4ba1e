"""How much the harness itself costs: the whole four-process pipeline on the zero-time `echo` worker.

    .venv/bin/python benchmarks/harness.py [--rates 1000,2000,5000,10000,20000] [--duration 3]
        [--strategy continuous|dynamic|naive] [--out results/harness]

For each target rate it runs `api.run` (traffic, scheduler, echo worker, collector as spawn
processes) and prints, from the run's summary and requests table: achieved vs target request rate, send lag
(send_time − planned arrival) p50/p99/max, scheduler dispatch latency (scheduled_time − recv_time)
p50/p99, harness TTFT (with an echo worker every ms of TTFT is harness overhead) p50/p99, lost
requests, and each role's CPU use. CPU is read from outside with psutil: the launcher writes
OUT/pids.json {role: pid}; this script samples each pid's user+system CPU time on every launcher tick
(0.2 s) and reports the share of one core used between planned time 0 and the end of the schedule.

"Sustained": no loss, send lag p99 ≤ 1 ms, and completions ≥ 95% of the target rate. The table is
written as OUT/harness.json and OUT/harness.parquet. Timings are printed, never asserted.
"""
import argparse
import json
import time
from pathlib import Path

import pandas as pd
import psutil

from batchlab.protocol.settings import RunConfig
from batchlab import api
from batchlab.collector.summary import Summary
from batchlab.protocol.run_dir import RunDir

LAG_P99_LIMIT_S = 0.001
MIN_ACHIEVED_FRACTION = 0.95
ROLES = ("traffic", "scheduler", "worker-0", "collector")
COLUMNS = [
    "strategy", "target_rate", "scheduled", "finished", "lost", "send_rate", "completion_rate",
    "send_lag_p50_ms", "send_lag_p99_ms", "send_lag_max_ms", "dispatch_p50_ms", "dispatch_p99_ms",
    "ttft_p50_ms", "ttft_p99_ms", "ttft_max_ms", *(f"cpu_{r}_pct" for r in ROLES),
    *(f"cpu_{r}_us_per_req" for r in ROLES), "sustained",
]


class CpuSampler:
    """Samples each role's CPU seconds (user + system) by pid on every launcher tick."""

    def __init__(self, out_dir: Path) -> None:
        self.pids_file = RunDir(out_dir).pids
        self.procs: dict[str, psutil.Process] = {}
        self.samples: dict[str, list[tuple[float, float]]] = {}  # role -> [(monotonic s, cpu s)]

    def tick(self, _event: api.Event) -> None:
        """api.run's on_progress: a tick Event on every launcher tick."""
        if not self.procs and self.pids_file.exists():
            pids = json.loads(self.pids_file.read_text())
            self.procs = {role: psutil.Process(pid) for role, pid in pids.items()}
        t = time.monotonic()
        for role, proc in self.procs.items():
            try:
                cpu = proc.cpu_times()
            except psutil.Error:  # exited: its last sample stands
                continue
            self.samples.setdefault(role, []).append((t, cpu.user + cpu.system))

    def cpu_s(self, role: str, start_s: float, end_s: float = float("inf")) -> tuple[float, float]:
        """(CPU s, wall s) `role` used from the last sample ≤ start_s to the first ≥ end_s (else its last)."""
        rows = self.samples.get(role, [])
        before = [s for s in rows if s[0] <= start_s] or rows[:1]
        after = [s for s in rows if s[0] >= end_s] or rows[-1:]
        if not before or not after or after[0][0] <= before[-1][0]:
            return float("nan"), float("nan")
        (t_a, c_a), (t_b, c_b) = before[-1], after[0]
        return c_b - c_a, t_b - t_a


def _ms(series: pd.Series, q: float) -> float:
    return 1000.0 * float(series.quantile(q)) if len(series) else float("nan")


def run_rate(rate: float, args: argparse.Namespace) -> dict:
    """One harness run at `rate` requests/s; its table row."""
    out = Path(args.out) / f"{args.strategy}-{rate:g}"
    cfg = RunConfig(strategy=args.strategy, backend="echo", dataset="synthetic", rate=rate,
                    duration_s=args.duration, arrival=args.arrival, max_new_tokens=args.max_new_tokens,
                    max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, seed=args.seed,
                    out=str(out)).validate()
    sampler = CpuSampler(out)
    summary = api.run(cfg, overwrite=True, on_progress=sampler.tick)  # with timing_fidelity (simulator, same schedule)
    return table_row(cfg, summary, pd.read_parquet(RunDir(out).table("requests")), sampler)


def table_row(cfg: RunConfig, summary: Summary, req: pd.DataFrame, sampler: CpuSampler) -> dict:
    """The figures of one run (times in the requests table are seconds since t0)."""
    sent = req[req["submitted"]]
    done = req[req["status"] == "finished"]
    send_span_s = float(sent["send_time"].max() - sent["send_time"].min()) if len(sent) > 1 else 0.0
    t0 = float(summary.settings["t0"])
    row = {
        "strategy": cfg.strategy, "target_rate": cfg.rate, "scheduled": len(req), "finished": len(done),
        "lost": len(req) - len(done),
        "send_rate": (len(sent) - 1) / send_span_s if send_span_s > 0 else 0.0,
        "completion_rate": summary.requests_per_s,
        **{f"send_lag_{q}_ms": 1e3 * summary.harness_lag.get(q, float("nan")) for q in ("p50", "p99", "max")},
        "dispatch_p50_ms": _ms(done["scheduled_time"] - done["recv_time"], 0.5),
        "dispatch_p99_ms": _ms(done["scheduled_time"] - done["recv_time"], 0.99),
        "ttft_p50_ms": 1e3 * (summary.ttft.p50 or float("nan")), "ttft_p99_ms": 1e3 * (summary.ttft.p99 or float("nan")),
        "ttft_max_ms": _ms(done["ttft"], 1.0),
    }
    for role in ROLES:  # the share while sending, and the cost per request from t0 to the end
        cpu_s, wall_s = sampler.cpu_s(role, t0, t0 + cfg.duration_s)
        row[f"cpu_{role}_pct"] = 100.0 * cpu_s / wall_s
        row[f"cpu_{role}_us_per_req"] = 1e6 * sampler.cpu_s(role, t0)[0] / max(len(sent), 1)
    row["sustained"] = bool(row["lost"] == 0 and row["send_lag_p99_ms"] <= 1000 * LAG_P99_LIMIT_S
                            and row["completion_rate"] >= MIN_ACHIEVED_FRACTION * cfg.rate)
    row["timing_fidelity"] = summary.timing_fidelity
    return row


def print_table(rows: list[dict]) -> None:
    """One line per rate."""
    print("times in ms; CPU: % of one core while sending / µs per request (traffic, scheduler, worker, "
          "collector)")
    print(f"{'target':>7} {'sent/s':>7} {'done/s':>7} {'lost':>5} | {'lag p50':>7} {'p99':>6} {'max':>6} | "
          f"{'disp p50':>8} {'p99':>6} | {'ttft p50':>8} {'p99':>6} | {'CPU %':^19} | {'CPU µs/req':^19} | ok")
    for r in rows:
        pct = " ".join(f"{r[f'cpu_{role}_pct']:4.0f}" for role in ROLES)
        per = " ".join(f"{r[f'cpu_{role}_us_per_req']:4.0f}" for role in ROLES)
        print(f"{r['target_rate']:>7g} {r['send_rate']:>7.0f} {r['completion_rate']:>7.0f} {r['lost']:>5} | "
              f"{r['send_lag_p50_ms']:>7.3f} {r['send_lag_p99_ms']:>6.2f} {r['send_lag_max_ms']:>6.1f} | "
              f"{r['dispatch_p50_ms']:>8.3f} {r['dispatch_p99_ms']:>6.2f} | "
              f"{r['ttft_p50_ms']:>8.3f} {r['ttft_p99_ms']:>6.2f} | {pct} | {per} | "
              f"{'yes' if r['sustained'] else 'no'}")
    ok = [r["target_rate"] for r in rows if r["sustained"]]
    print(f"highest sustained rate (no loss, send lag p99 ≤ {1000 * LAG_P99_LIMIT_S:g} ms, "
          f"≥ {MIN_ACHIEVED_FRACTION:.0%} of target completed): {max(ok) if ok else 'none'} requests/s")


def write_table(rows: list[dict], out: Path) -> None:
    """OUT/harness.json (rows, fidelity included) and OUT/harness.parquet (the flat columns)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "harness.json").write_text(json.dumps(rows, indent=2, default=float))
    pd.DataFrame(rows, columns=COLUMNS).to_parquet(out / "harness.parquet", index=False)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1000,2000,5000,10000,20000", help="comma list, requests/s")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of traffic per rate")
    p.add_argument("--strategy", default="continuous")
    p.add_argument("--arrival", default="poisson")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--max-batch-size", type=int, default=256, help="worker rows (continuous credit)")
    p.add_argument("--max-wait-ms", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/harness")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Every rate in turn; print, write and return the table."""
    args = parse_args(argv)
    rows = [run_rate(float(r), args) for r in args.rates.split(",")]
    print_table(rows)
    write_table(rows, Path(args.out))
    return rows


if __name__ == "__main__":
    main()
