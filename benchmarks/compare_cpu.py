"""Four columns on the same open-loop trace: naive (HF), dynamic (HF), continuous (HF) and continuous (vLLM).

Each column plays one seeded Poisson trace per rate (traffic/'s synthetic schedule) against a backend in
this process: a small loop stands in for the scheduler process around the same SchedulerCore and pure
policies, so process and socket overheads are left out and only batching and the engine differ. Rows are
random token ids (prompt 16..`--max-prompt-len`, output 4..`--max-new-tokens` tokens, greedy, exact
lengths). Per point: output tokens/s (all tokens ÷ first arrival → last token) and TTFT p50/p99 (first
token − arrival; stats.metrics.percentiles). The summary gives continuous(HF) ÷ vLLM per rate and at
each column's knee (best tokens/s).

    python benchmarks/compare_cpu.py --rates 2,4,8,16 --duration 10 [--json out.json]
"""
import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from batchlab.protocol import RequestMsg
from batchlab.protocol.clock import now, sleep_until
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.launch import Launch
from batchlab.scheduler.policies import Continuous, Dynamic, Naive
from batchlab.stats.metrics import percentiles
from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.schedule import Schedule, build_schedule
from batchlab.worker.backend import OutOfMemory, BackendRequest, StepOutput, worker_hello

IDLE_SLEEP_S = 0.05  # longest nap while nothing is queued or running
WORKER = "worker-0"
MIN_PROMPT_LEN, MIN_OUTPUT_LEN = 16, 4


@dataclass(slots=True)
class Point:
    """One column at one rate."""

    column: str
    rate: float
    requests: int
    finished: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float


@dataclass(slots=True)
class Tally:
    """Per-request stamps, seconds from the trace's start."""

    arrival: dict[int, float]
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)
    tokens: int = 0

    def take(self, out: StepOutput, t0: float) -> None:
        for rid in out.request_ids:
            self.first.setdefault(rid, out.time - t0)
            self.last[rid] = out.time - t0
        self.tokens += len(out.request_ids)


def make_trace(rate: float, args) -> Schedule:
    """Poisson arrivals over --duration; seeded uniform prompt and output lengths (traffic's synthetic set)."""
    cfg = TrafficConfig(arrival="poisson", rate=rate, duration_s=args.duration, seed=args.seed, dataset="synthetic",
                        max_new_tokens=args.max_new_tokens, max_prompt_len=args.max_prompt_len,
                        min_prompt_len=MIN_PROMPT_LEN,
                        prompt_lengths=LengthSpec("uniform", min=MIN_PROMPT_LEN, max=args.max_prompt_len),
                        output_lengths=LengthSpec("uniform", min=MIN_OUTPUT_LEN, max=args.max_new_tokens))
    return build_schedule(cfg, None)


def point(column: str, rate: float, trace: Schedule, tally: Tally) -> Point:
    ttft = percentiles(pd.Series([tally.first[rid] - tally.arrival[rid] for rid in tally.first], dtype="float64"))
    wall = max(tally.last.values(), default=0.0)
    return Point(column, rate, trace.n_requests, len(tally.last), round(wall, 2),
                 round(tally.tokens / wall if wall else 0.0, 1), round(ttft["p50"] or 0.0, 4),
                 round(ttft["p99"] or 0.0, 4))


class Driver:
    """The scheduler process's job in-process, around SchedulerCore: the trace's arrivals in, its
    launches to the backend (a static batch runs to its end here; a continuous backend steps)."""

    def __init__(self, backend, policy, trace: Schedule) -> None:
        self.backend = backend
        self.core = SchedulerCore(policy)
        self.core.on_hello(WORKER, worker_hello(WORKER, backend.info), 0.0)
        frame = trace.frame
        self.arrivals = frame["arrival_offset_s"].tolist()
        self.requests = list(zip(frame["request_id"].tolist(), frame["prompt_len"].tolist(),
                                 frame["output_len"].tolist(), frame["prompt_tokens"].tolist()))
        self.next = 0
        self.wake_at: float | None = None
        self.batch_of: dict[int, int] = {}  # request id -> its batch (continuous)
        self.failed: dict[int, str] = {}  # request id -> the core's reason
        self.tally = Tally(dict(zip(frame["request_id"].tolist(), self.arrivals)))

    def play(self) -> Tally:
        """Run the trace until every request ended."""
        self.t0 = now()
        while True:
            # 1. arrivals due by now (the last one ends the stream)
            self._arrivals()
            # 2. the core launches: a continuous backend admits, a static one runs the batch to its end
            launched = self._launch()
            # 3. a continuous backend advances one step; else nap until something is due
            if self.backend.info.mode == "continuous" and self.backend.has_work():
                self._step()
            elif not launched:
                self._nap()
            self.failed.update((f.request_id, f.reason) for f in self.core.drain())
            # 4. done?
            if self.core.done():
                return self.tally

    def _clock(self) -> float:
        return now() - self.t0

    def _arrivals(self) -> None:
        t = self._clock()
        while self.next < len(self.requests) and self.arrivals[self.next] <= t:
            rid, prompt_len, output_len, _ = self.requests[self.next]
            arrival = self.arrivals[self.next]
            self.core.on_request(RequestMsg(rid, arrival, arrival, prompt_len, output_len), t)
            self.next += 1
        if self.next == len(self.requests):
            self.core.end_of_stream()

    def _launch(self) -> bool:
        decisions = self.core.schedule(self._clock())
        self.wake_at = decisions.wake_at
        for launch in decisions.launches:
            rows = [BackendRequest(r.request, r.batch_id, self.requests[r.request.request_id][3]) for r in launch.rows]
            if self.backend.info.mode == "continuous":
                self.batch_of.update((r.request_id, r.batch_id) for r in rows)
                self.backend.admit(rows)
            else:
                self._run_static(launch, rows)
        return bool(decisions.launches)

    def _run_static(self, launch: Launch, rows: list[BackendRequest]) -> None:
        oom = False
        try:
            self.backend.run_batch(rows, lambda out: self.tally.take(out, self.t0))
        except OutOfMemory:  # the core requeues the batch (or fails a single row) and the policy backs off
            oom = True
        self.core.on_batch_done(WORKER, rows[0].batch_id, oom, self._clock())  # a static launch is one batch

    def _step(self) -> None:
        out = self.backend.step()
        if out is None:
            return
        self.tally.take(out, self.t0)
        for rid in out.finished + [rid for rid, _ in out.failed]:
            batch_id = self.batch_of.pop(rid, None)
            if batch_id is not None:
                self.core.on_batch_done(WORKER, batch_id, False, self._clock())

    def _nap(self) -> None:
        t = self._clock()
        wake = min([t + IDLE_SLEEP_S] + [self.arrivals[self.next]] * (self.next < len(self.arrivals))
                   + [self.wake_at] * (self.wake_at is not None))
        sleep_until(self.t0 + wake)


def hf_columns(args) -> dict[str, tuple[object, object]]:
    """naive and dynamic share the continuous backend's HFBackend (one model in memory)."""
    from batchlab.worker.hf.static import HFSettings
    from batchlab.worker.hf.continuous import HFContinuousBackend

    cont = HFContinuousBackend(HFSettings(model=args.model, dtype=args.dtype, device="cpu",
                                          max_batch_size=args.max_batch_size))
    cont.warmup()
    return {"naive-hf": (cont.base, lambda: Naive(args.max_batch_size)),
            "dynamic-hf": (cont.base, lambda: Dynamic(args.max_batch_size, args.max_wait_ms / 1000,
                                                      args.max_new_tokens)),
            "continuous-hf": (cont, lambda: Continuous(args.max_batch_size))}


def vllm_column(args) -> dict[str, tuple[object, object]]:
    """vLLM's own continuous batching, fed by the same credit policy."""
    from batchlab.worker.vllm_engine import VLLMBackend, VLLMSettings

    backend = VLLMBackend(VLLMSettings(model=args.model, dtype=args.dtype, max_num_seqs=args.max_batch_size,
                                       enforce_eager=args.enforce_eager, kv_cache_bytes=2**30))
    backend.warmup()
    return {"vllm": (backend, lambda: Continuous(args.max_batch_size))}


def ratios(points: list[Point]) -> dict:
    """continuous(HF) ÷ vLLM tokens/s per rate and at each column's knee (its best tokens/s)."""
    by = {(p.column, p.rate): p for p in points}
    per_rate = {str(p.rate): round(p.tokens_per_s / by["vllm", p.rate].tokens_per_s, 3)
                for p in points if p.column == "continuous-hf" and ("vllm", p.rate) in by}
    knee = {c: max((p.tokens_per_s for p in points if p.column == c), default=0.0)
            for c in ("naive-hf", "dynamic-hf", "continuous-hf", "vllm")}
    at_knee = round(knee["continuous-hf"] / knee["vllm"], 3) if knee["vllm"] else None
    return {"continuous_hf_over_vllm_by_rate": per_rate, "knee_tokens_per_s": knee,
            "continuous_hf_over_vllm_at_knee": at_knee}


def run_columns(columns: dict, args) -> list[Point]:
    points = []
    for name, (backend, make_policy) in columns.items():
        for rate in args.rate_list:
            trace = make_trace(rate, args)
            points.append(point(name, rate, trace, Driver(backend, make_policy(), trace).play()))
            print("  ".join(f"{k}={v}" for k, v in asdict(points[-1]).items()), flush=True)
    return points


def main() -> None:
    """Parse options, play every column at every rate, print the points and ratios (and JSON)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-mistral")
    p.add_argument("--rates", default="2,4,8,16", help="requests/s, comma-separated")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals per point")
    p.add_argument("--max-prompt-len", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-wait-ms", type=float, default=200.0)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--columns", default="hf,vllm", help="hf (naive, dynamic, continuous) and/or vllm")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="")
    args = p.parse_args()
    args.rate_list = [float(r) for r in args.rates.split(",")]
    points = []
    for group in args.columns.split(","):
        columns = hf_columns(args) if group == "hf" else vllm_column(args)
        points += run_columns(columns, args)
        for backend in {id(b): b for b, _ in columns.values()}.values():
            backend.close()
    summary = ratios(points)
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps({"points": [asdict(q) for q in points], **summary}, indent=2))


if __name__ == "__main__":
    main()
