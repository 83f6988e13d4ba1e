"""How fast a study's twin answers: each strategy's twin fitted to a finished sweep's saturated runs, its capacity
searched in virtual time (lab.twin.twin_capacity: a 120 s saturated run per repeat, then probes of 600 s and more),
then every strategy's twin again side by side (lab.capacity_study.played_twins, as the study plays them), and the
twin's curves played (lab.twin_curves.play_curves), as `batchlab sweep` does between its live runs.

    .venv/bin/python benchmarks/twin_speed.py /tmp/smoke [--config configs/smoke.yaml] [--work /tmp/twin-speed]

FOLDER is a finished `batchlab sweep CONFIG --out FOLDER` with a twin (configs/smoke.yaml's). Prints each phase's
wall and CPU time and a digest of its answers (the capacity records, every curve point's summary), so that a faster
simulator can be checked to answer the very same. Nothing in FOLDER is changed: the work goes to a fresh copy of its
saturated runs in WORK (replaced each time: its path is in every simulated run's settings, so in the digests).
Timings are printed, never asserted.
"""
import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from batchlab.collector.layout import CAPACITY_FILE, SATURATED_DIR, TWIN_DIR
from batchlab.lab.capacity_search import measured
from batchlab.lab.capacity_study import played_twins
from batchlab.lab.sweep_plan import load_plan
from batchlab.lab.twin import fit_twin, twin_capacity
from batchlab.lab.twin_curves import play_curves


def saturated_runs(out: Path, label: str) -> list:
    """A strategy's saturated runs as the study measured them (their folders under OUT/_saturated/)."""
    runs = []
    for folder in sorted((out / SATURATED_DIR).glob(f"*={label}/*/*")):
        repeat = int(folder.name.rsplit("=", 1)[1])
        duration_s = float(yaml.safe_load((folder / "config.yaml").read_text())["duration_s"])
        runs.append(measured(folder, duration_s, repeat, str(folder.relative_to(out))))
    return runs


def digest(value: object) -> str:
    """A short hash of a JSON-able value (equal answers, equal digests)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def answers(summary: dict) -> dict:
    """A simulated run's summary less what the code's version and the machine's speed write into it (the commit,
    in its settings' environment and their hash; the simulation's wall time)."""
    settings = {k: v for k, v in summary["settings"].items() if k not in ("environment", "config_hash")}
    return {k: v for k, v in summary.items() if k != "simulation_wall_s"} | {"settings": settings}


def timed(what: str, work):
    """work()'s value; its wall and CPU time printed."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    value = work()
    print(f"{what:>28}: {time.perf_counter() - wall0:6.2f} s wall, {time.process_time() - cpu0:6.2f} s CPU")
    return value


def main() -> None:
    """Fit, search and play every strategy's twin once, timing each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a finished sweep's folder with a twin")
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "twin-speed")
    args = parser.parse_args()
    plan = load_plan(args.config)
    capacity = json.loads((args.folder / CAPACITY_FILE).read_text())
    out = args.work
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(args.folder / SATURATED_DIR, out / SATURATED_DIR)
    try:
        wall0 = time.perf_counter()
        for entry in plan.entries:
            runs = saturated_runs(out, entry.label)
            fit = timed(f"fit {entry.label}", lambda: fit_twin(out, entry.label, runs))
            cap, record = timed(f"capacity search {entry.label}", lambda: twin_capacity(plan, fit, plan.auto))
            capacity["strategies"][entry.label]["twin"]["preset"] = str(fit.preset)
            print(f"{'':>28}  capacity {cap.estimate_req_s}, μ {record['saturated']['req_s']}, "
                  f"digest {digest([cap.as_dict(), record])}")
        runs = {entry.label: saturated_runs(out, entry.label) for entry in plan.entries}
        twins = timed("side by side (played_twins)", lambda: played_twins(plan, out, plan.entries, runs, plan.auto))
        print(f"{'':>28}  digests " + ", ".join(f"{label} {digest([cap.as_dict(), record])}"
                                                for label, (_, cap, record) in twins.items()))
        timed("curves", lambda: play_curves(plan, out, capacity))
        summaries = [answers(json.loads(p.read_text())) for p in sorted((out / TWIN_DIR).glob("*/*/*/summary.json"))]
        print(f"{len(summaries)} curve points, digest {digest(summaries)}; "
              f"{time.perf_counter() - wall0:.2f} s wall in all")
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
