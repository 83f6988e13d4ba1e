"""A 200-candidate `tune` search fanned out on a local Ray cluster of one node vs two (one CPU each, on
loopback), and in one local process vs two: wall seconds and the speed-up. Each cluster's workers are
warmed by a first search before the timed one (a worker's start-up is not the fan-out's cost).

    .venv/bin/python benchmarks/ray_tune.py [--duration 20] [--repeats 1]
"""
import argparse
import os
import time

from batchlab.runner.preflight import checked_config
from batchlab.lab.fanout import Fanout
from batchlab.lab.ray_cluster import LocalCluster, connect
from batchlab.lab.tune import search
from batchlab.traffic.run_schedule import make_schedule

SIZES = [1, 2, 4, 8, 12, 16, 24, 32]
WAITS_MS = [float(w) for w in range(0, 250, 10)]  # 25 values: 8 × 25 = 200 candidates


def timed_search(cfg, schedule, fanout: Fanout, repeats: int) -> float:
    """The best of `repeats` wall times of one whole search, s."""
    space = {"max_batch_size": SIZES, "max_wait_ms": WAITS_MS}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        ranked = search(cfg, schedule, space, fanout)
        best = min(best, time.perf_counter() - start)
        assert len(ranked) == len(SIZES) * len(WAITS_MS)
    return best


def on_cluster(n_nodes: int, cfg, schedule, repeats: int) -> float:
    cluster = LocalCluster()
    try:
        cluster.start_head(num_cpus=1)
        for _ in range(n_nodes - 1):
            cluster.add_node(num_cpus=1)
        os.environ.update(cluster.env)  # the driver says the cluster's auth setting
        ray = connect(cluster.address)
        fanout = Fanout(ray_address=cluster.address)
        search(cfg, schedule, {"max_batch_size": SIZES[:2 * n_nodes], "max_wait_ms": [0.0]}, fanout)  # warm
        seconds = timed_search(cfg, schedule, fanout, repeats)
        ray.shutdown()
        return seconds
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", "--duration-s", dest="duration_s", type=float, default=20.0,
                        help="seconds of traffic each candidate plays (--duration-s: the former spelling)")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    cfg = checked_config({"strategy": "dynamic", "dataset": "synthetic", "rate": args.rate,
                          "duration_s": args.duration_s, "slo": ["ttft=500ms"], "out": "."}, {})
    schedule = make_schedule(cfg)
    rows = {"1 process": timed_search(cfg, schedule, Fanout(processes=1), args.repeats),
            "2 processes": timed_search(cfg, schedule, Fanout(processes=2), args.repeats),
            "Ray, 1 node": on_cluster(1, cfg, schedule, args.repeats),
            "Ray, 2 nodes": on_cluster(2, cfg, schedule, args.repeats)}
    print(f"200 candidates, {len(schedule.frame)} requests each ({args.rate:g} req/s × {args.duration_s:g} s)")
    for name, seconds in rows.items():
        print(f"  {name:14s} {seconds:7.2f} s")
    print(f"speed-up: processes {rows['1 process'] / rows['2 processes']:.2f}×, "
          f"Ray nodes {rows['Ray, 1 node'] / rows['Ray, 2 nodes']:.2f}× (goal ≥ 1.7× on two nodes)")


if __name__ == "__main__":
    main()
