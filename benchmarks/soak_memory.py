"""Memory of an echo soak: `batchlab run --backend echo --rate R --duration D` as a user starts it (a CLI process,
the launcher), every process's peak RSS sampled from outside, the launcher's included, until the command ends
(its final write, post-processing and result table included), then `batchlab report OUT`'s.

    .venv/bin/python benchmarks/soak_memory.py [--rate 5000] [--duration 60] [--out results/soak]
        [--strategy dynamic] [--dataset sharegpt]

Prints each process's peak RSS (VmHWM: the kernel's high-water mark, so a peak between samples still
counts), each role's RSS at the traffic's end and at the run's end, and the collector's growth per request
from half to 95% of the requests (a least-squares slope of its RSS against the requests it had, from
progress.json: near zero when its memory follows what is in flight, not the run's length).
The figures go to OUT/soak_memory.json. Figures are printed, never asserted.
"""
import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_S = 0.2
MIB = 1 << 20


def _status_kib(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    """Every SAMPLE_S: the launcher's and each role's peak and current RSS, and the run's request counts."""

    def __init__(self, launcher_pid: int, out: Path) -> None:
        super().__init__(daemon=True)
        self.launcher, self.out = launcher_pid, out
        self.peak_kib: dict[str, int] = {}
        self.series: dict[str, list[tuple[float, float, int]]] = {}  # role -> [(s, rss MiB, requests arrived)]
        self.done = threading.Event()

    def run(self) -> None:
        start, pids = time.monotonic(), {}
        while not self.done.is_set():
            if not pids and (self.out / "pids.json").exists():
                pids = json.loads((self.out / "pids.json").read_text())
            arrived = self._arrived()
            for role, pid in {"launcher": self.launcher, **pids}.items():
                peak, rss = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
                if peak is None or rss is None:  # exited: its last sample stands
                    continue
                self.peak_kib[role] = max(self.peak_kib.get(role, 0), peak)
                self.series.setdefault(role, []).append((round(time.monotonic() - start, 2), rss / 1024, arrived))
            time.sleep(SAMPLE_S)

    def _arrived(self) -> int:
        try:
            return int(json.loads((self.out / "progress.json").read_text()).get("arrived", 0))
        except (OSError, ValueError):
            return 0


def command_peak_mib(command: list[str]) -> tuple[float, int]:
    """(peak RSS in MiB, exit code) of a command run to its end, its VmHWM read every SAMPLE_S."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _status_kib(proc.pid, "VmHWM") or 0)
        time.sleep(SAMPLE_S)
    return peak / 1024, proc.returncode


def growth_kib_per_request(series: list[tuple[float, float, int]]) -> float | None:
    """The slope of RSS (KiB) against the requests arrived, from half to 95% of the arrivals (the first half
    fills what a steady state holds: the requests of the last KEEP_TAKES part files, the queues; the last
    samples may fall in the final write)."""
    last = max((arrived for _, _, arrived in series), default=0)
    points = [(arrived, rss) for _, rss, arrived in series if last / 2 <= arrived <= 0.95 * last]
    counts = sorted({a for a, _ in points})
    if len(counts) < 3:
        return None
    arrived = np.array([a for a, _ in points], float)
    rss_kib = np.array([r * 1024 for _, r in points])
    return float(np.polyfit(arrived, rss_kib, 1)[0])


def soak(args: argparse.Namespace) -> dict:
    """One run through the CLI, sampled; its figures."""
    out = Path(args.out)
    command = [sys.executable, "-m", "batchlab.cli.main", "run", "--backend", "echo", "--rate", str(args.rate),
               "--duration", str(args.duration), "--strategy", args.strategy, "--dataset", args.dataset,
               "--out", str(out), "--overwrite"]
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = Sampler(proc.pid, out)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.done.set()
    sampler.join()
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    report_mib, report_code = command_peak_mib([sys.executable, "-m", "batchlab.cli.main", "report", str(out)])
    sampler.peak_kib["report"] = int(report_mib * 1024)
    return {"command": " ".join(command[2:]), "exit_code": proc.returncode, "report_exit_code": report_code,
            "wall_s": round(time.monotonic() - started, 1),
            "requests": summary.get("scheduled"), "finished": summary.get("finished"),
            "peak_rss_mib": {role: round(kib / 1024, 1) for role, kib in sampler.peak_kib.items()},
            "collector_growth_kib_per_request": growth_kib_per_request(sampler.series.get("collector", [])),
            "last_line": (stderr.strip().splitlines() or [""])[-1], "series": sampler.series}


def report(fig: dict) -> None:
    """The figures, one process a line."""
    print(f"{fig['command']}: exit {fig['exit_code']} after {fig['wall_s']} s, {fig['requests']} requests "
          f"({fig['finished']} finished)")
    for role, mib in sorted(fig["peak_rss_mib"].items()):
        print(f"  {role:<10} peak RSS {mib:8.1f} MiB")
    growth = fig["collector_growth_kib_per_request"]
    print(f"collector growth from half to 95% of the requests: {'?' if growth is None else f'{growth:.3f}'} "
          "KiB per request")
    print(f"largest peak RSS: {max(fig['peak_rss_mib'].values(), default=0):.0f} MiB "
          f"({max(fig['peak_rss_mib'], key=fig['peak_rss_mib'].get, default='-')})")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=5000.0, help="requests/s")
    p.add_argument("--duration", type=float, default=60.0, help="s of traffic")
    p.add_argument("--strategy", default="dynamic")
    p.add_argument("--dataset", default="sharegpt")
    p.add_argument("--out", default="results/soak")
    args = p.parse_args(argv)
    fig = soak(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "soak_memory.json").write_text(json.dumps(fig, indent=2))
    report(fig)
    return fig


if __name__ == "__main__":
    main()
