"""Four columns on the same open-loop trace: naive (HF), dynamic (HF), continuous (HF) and continuous (vLLM).

Each column plays one seeded Poisson trace per rate against a backend in this process: a small loop
stands in for the scheduler (the same pure policies from scheduler/policies.py decide), so process and
socket overheads are left out and only batching and the engine differ. Rows are random token ids
(prompt 16..`--max-prompt-len`, output 4..`--max-new-tokens` tokens, greedy, exact lengths).
Per point: output tokens/s (all tokens ÷ first arrival → last token) and TTFT p50/p99 (first token −
arrival). The summary gives continuous(HF) ÷ vLLM per rate and at each column's knee (best tokens/s).

    python benchmarks/compare_cpu.py --rates 2,4,8,16 --duration 10 [--json out.json]
"""
import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchlab.protocol.clock import now, sleep_until  # noqa: E402
from batchlab.scheduler.policies import Capacity, Continuous, Dynamic, Naive, QueuedRequest  # noqa: E402
from batchlab.worker.backend import Row, StepOutput  # noqa: E402

IDLE_SLEEP_S = 0.05  # longest nap while nothing is queued or running


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


def make_trace(rate: float, duration_s: float, args, seed: int) -> list[tuple[float, Row]]:
    """Poisson arrivals over `duration_s`; seeded random prompts and output lengths."""
    rng, t, trace = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rate)) < duration_s:
        p, o = rng.randint(16, args.max_prompt_len), rng.randint(4, args.max_new_tokens)
        trace.append((t, Row(len(trace), p, o, [rng.randrange(100, 32000) for _ in range(p)], len(trace))))
    return trace


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (0 for no values)."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def point(column: str, rate: float, trace: list[tuple[float, Row]], tally: Tally) -> Point:
    ttft = [tally.first[rid] - tally.arrival[rid] for rid in tally.first]
    wall = max(tally.last.values(), default=0.0)
    done = sum(1 for _, r in trace if r.request_id in tally.last and r.output_len)
    return Point(column, rate, len(trace), done, round(wall, 2), round(tally.tokens / wall if wall else 0.0, 1),
                 round(quantile(ttft, 0.5), 4), round(quantile(ttft, 0.99), 4))


class Driver:
    """The scheduler's job in-process: arrivals into a queue, a policy decides, the backend runs."""

    def __init__(self, backend, policy, trace: list[tuple[float, Row]]) -> None:
        self.backend, self.policy, self.trace = backend, policy, trace
        self.queue: list[tuple[float, Row]] = []
        self.next, self.running, self.promised_bytes = 0, {}, 0
        self.tally = Tally({r.request_id: t for t, r in trace})

    def play(self) -> Tally:
        """Run the trace to the end; continuous backends step while busy, static ones run whole batches."""
        self.t0 = now()
        while self.next < len(self.trace) or self.queue or self.running or self._busy():
            self._arrivals()
            launched = self._launch()
            if self.backend.info.mode == "continuous" and self._busy():
                self._step()
            elif not launched:
                self._nap()
        return self.tally

    def _busy(self) -> bool:
        return self.backend.info.mode == "continuous" and self.backend.has_work()

    def _arrivals(self) -> None:
        t = now() - self.t0
        while self.next < len(self.trace) and self.trace[self.next][0] <= t:
            self.queue.append(self.trace[self.next])
            self.next += 1

    def _launch(self) -> bool:
        info = self.backend.info
        cap = Capacity(info.max_batch_size - len(self.running), info.kv_budget_bytes - self.promised_bytes,
                       info.kv_bytes_per_token, idle=not self.running)
        queued = [QueuedRequest(r.request_id, t, r.prompt_len, r.output_len) for t, r in self.queue]
        decision = self.policy.decide(queued, now() - self.t0, cap, self.next >= len(self.trace))
        self.wake_at = decision.wake_at
        if not decision.n:
            return False
        rows, self.queue = [r for _, r in self.queue[:decision.n]], self.queue[decision.n:]
        if info.mode == "continuous":
            self._admit(rows)
        else:
            self.backend.run_batch(rows, lambda out: self.tally.take(out, self.t0))
        return True

    def _admit(self, rows: list[Row]) -> None:
        for r in rows:
            self.running[r.request_id] = (r.prompt_len + r.output_len) * self.backend.info.kv_bytes_per_token
            self.promised_bytes += self.running[r.request_id]
        self.backend.admit(rows)

    def _step(self) -> None:
        out = self.backend.step()
        if out is None:
            return
        self.tally.take(out, self.t0)
        for rid in out.finished + [rid for rid, _ in out.failed]:
            self.promised_bytes -= self.running.pop(rid, 0)

    def _nap(self) -> None:
        t = now() - self.t0
        wake = min([t + IDLE_SLEEP_S] + [self.trace[self.next][0]] * (self.next < len(self.trace))
                   + [self.wake_at] * (self.wake_at is not None))
        sleep_until(self.t0 + wake)


def hf_columns(args) -> dict[str, tuple[object, object]]:
    """naive and dynamic share the continuous backend's HFBackend (one model in memory)."""
    from batchlab.worker.hf import HFSettings
    from batchlab.worker.hf_continuous import HFContinuousBackend

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
            trace = make_trace(rate, args.duration, args, args.seed)
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
