"""How fast `batchlab simulate` runs a sweep: configs/sim-shapes.yaml is 3 strategies × 10 rates × 60 s
of traffic at up to 50 req/s. Goal: under 5 s of wall time on the 2-core CPU box, files included.

    .venv/bin/python benchmarks/simulate_speed.py [--config configs/sim-shapes.yaml] [--out DIR]

Prints each point's own simulation time as the library measures it (the schedule, built once per rate and
seed, is not in it) and the totals (wall, and this process's CPU time, which other load on the machine
disturbs less; both include planning, the schedules and the index). Timings are printed, never asserted.
"""
import argparse
import tempfile
import time

from batchlab.lab.sweep_plan import Point
from batchlab.lab.simulate import plan_simulation, run_simulation
from batchlab.collector.summary import Summary

GOAL_WALL_S = 5.0


def main() -> None:
    """Run the sweep once, timing every point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sim-shapes.yaml")
    parser.add_argument("--out", default="", help="output folder (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="simulate-speed-") as tmp:
        plan = plan_simulation(args.config, {"out": args.out or tmp})
        totals = {"requests": 0, "tokens": 0}

        def on_point(point: Point, summary: Summary, elapsed_s: float) -> None:
            totals["requests"] += summary.submitted
            totals["tokens"] += summary.output_tokens
            print(f"{point.entry.label:>10} {point.rate:>5g} req/s  {summary.submitted:>5} requests  "
                  f"{summary.output_tokens:>7} tokens  {1000 * elapsed_s:6.0f} ms")

        wall0, cpu0 = time.perf_counter(), time.process_time()
        results = run_simulation(plan, on_point)
        wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"{len(results)} points, {totals['requests']} requests, {totals['tokens']} tokens: "
          f"{wall_s:.2f} s wall, {cpu_s:.2f} s CPU (schedules, simulation, tables and files; "
          f"goal < {GOAL_WALL_S:g} s wall: {'met' if wall_s < GOAL_WALL_S else 'NOT met'})")


if __name__ == "__main__":
    main()
