"""Published GPU measurements (simulator.measurements) replayed in the simulator, and the error of each
prediction.

`replay` plays one configuration through simulator.run.simulate with the step model of its GPU, model and
engine terms (virtual time, the live scheduler's vLLM policy), and computes the published metrics the way the
benchmark that published them computed them (vLLM's benchmark_serving: duration from the first request to
the last completion; TPOT per request (E2E − TTFT)/(output − 1) over outputs of 2 or more tokens; a request the
source recorded with no output token counted with TTFT 0, as that benchmark did).
"""
import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from batchlab.models.archs import ARCHS, kv_bytes_per_token
from batchlab.protocol import RequestMsg
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.settings import RunConfig
from batchlab.scheduler.policies import Capacity, Decision
from batchlab.simulator.measurements import GROUPS, Measurement
from batchlab.simulator.run import simulate
from batchlab.traffic.schedule import Schedule
from batchlab.worker.gpu_presets import Terms, step_model_for
from batchlab.worker.stepmodel import StepModel, save_preset
from batchlab.protocol.status import RequestStatus

GROUP_ORDER = ("throughput", "tpot", "ttft")
NEVER_S = 1e9  # a closed loop's traffic duration: every request of the sample is sent


@dataclass(slots=True)
class Prediction:
    """The simulated metrics of one configuration (same units as the figures)."""

    metrics: dict[str, float]
    simulated_s: float  # virtual seconds the run lasted


@dataclass(slots=True)
class PublishedPrediction:
    """One published figure beside its prediction."""

    measurement: str
    source: str
    gpu: str
    split: str
    metric: str
    published: float
    predicted: float
    scored: bool

    @property
    def group(self) -> str:
        """throughput, tpot or ttft."""
        return GROUPS[self.metric]

    @property
    def error(self) -> float:
        """predicted ÷ published − 1."""
        return self.predicted / self.published - 1


# --- replaying one configuration --------------------------------------------------------------------------
@dataclass(slots=True)
class DirectParams:
    """direct's parameter: the engine's --max-num-seqs (the run's max_batch_size)."""

    max_batch_size: int = 256


class Direct:
    """A benchmark client talking to the engine's server, with no batchlab scheduler between: each request goes to
    the engine as soon as it has a row for it (--max-num-seqs); no KV credit is reserved (the engine's own pool
    admits it: a `prefill_alone` model's paged pool, worker.vllm_v0)."""

    name = "direct"
    mode = BatchingMode.CONTINUOUS
    Params = DirectParams

    def __init__(self, params: DirectParams) -> None:
        self.rows = params.max_batch_size

    def decide(self, queue: list[RequestMsg], now: float, cap: Capacity, end_of_stream: bool) -> Decision:
        """As many of `queue` as the worker has free rows for."""
        n = min(len(queue), max(0, min(cap.free_slots, self.rows)))
        return Decision(n, "direct") if n else Decision()

    def on_batch_done(self, size: int, oom: bool) -> None:
        """Rows come back through the capacity the scheduler reports."""


DIRECT = f"{__name__}:Direct"


def step_model(m: Measurement, terms: Terms) -> StepModel:
    """The step model the configuration plays: its GPU's datasheet and generation, its model, its engine's terms."""
    return StepModel(**step_model_for(f"{m.gpu}-{m.model}-{m.terms}", m.gpu, m.model, m.terms, terms))


def predict(m: Measurement, terms: Terms) -> Prediction:
    """`m` replayed under a terms file's values: its GPU die's efficiency, its engine version's step terms and front
    end."""
    engine = terms.engines[m.terms]
    return replay(m, step_model(m, terms), engine.request_overhead_s, engine.front_end_blocks, engine.async_output)


def arrivals(m: Measurement) -> np.ndarray:
    """When each request was sent (s): all at 0, or Poisson at the rate, the first at 0 (vLLM's benchmark_serving),
    seeded; a closed loop's first requests at 0."""
    n = len(m.prompts)
    if m.load != "open":
        return np.zeros(n)
    gaps = np.random.default_rng(m.seed).exponential(1.0 / m.rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def front_end(sent_s: np.ndarray, request_overhead_s: float, blocks: bool = False) -> np.ndarray:
    """When each request reaches the scheduler through a front end that spends `request_overhead_s` of one CPU on
    each, in arrival order (a FIFO single server). `blocks`: the engine shares the front end's event loop, so it
    sees a busy period's requests only when the front end is done with them all (it runs no step before)."""
    out, free_s = np.empty(len(sent_s)), 0.0
    for k, t in enumerate(sent_s):
        free_s = max(t, free_s) + request_overhead_s
        out[k] = free_s
    if blocks:  # a busy period ends where the next request arrives after the last one was taken in
        ends = np.append(np.asarray(sent_s)[1:] > out[:-1], True)
        out = np.flip(np.minimum.accumulate(np.flip(np.where(ends, out, np.inf))))
    return out


def schedule_of(m: Measurement, offsets_s: np.ndarray) -> Schedule:
    """The configuration's requests as a schedule arriving at `offsets_s` (lengths only: no tokens needed)."""
    n = len(m.prompts)
    frame = pd.DataFrame({"request_id": np.arange(n, dtype=np.int64), "arrival_offset_s": offsets_s,
                          "prompt": [""] * n, "prompt_len": np.asarray(m.prompts, dtype=np.int64),
                          "output_len": np.maximum(np.asarray(m.outputs, dtype=np.int64), 1),
                          "prompt_tokens": [[] for _ in range(n)]})
    duration_s = NEVER_S if m.load == "closed" else float(offsets_s[-1]) + 1.0
    return Schedule(frame, f"published:{m.id}", duration_s)


def run_config(m: Measurement, preset: Path, think_s: float = 0.0) -> RunConfig:
    """The simulated run: the benchmark's requests straight to the engine (Direct) on the `sim` backend playing
    `preset`, the configuration's load (`think_s`: a closed loop's clients wait this long before each request, the
    front end's cost); the KV pool the source reports, when it does, is the worker's budget."""
    values = dict(strategy=DIRECT, backend="sim", preset=str(preset), dataset="synthetic", seed=m.seed,
                  max_batch_size=m.max_num_seqs, max_num_seqs=m.max_num_seqs, max_new_tokens=max(m.outputs + [1]),
                  max_prompt_len=max(m.prompts), num_requests=len(m.prompts), max_queue=0, stall_limit_s=0.0,
                  out=str(preset.parent / "run"))
    if m.step_tokens:
        values["max_num_batched_tokens"] = max(m.step_tokens, m.max_num_seqs)
    if m.kv_tokens:
        values["memory_budget"] = str(m.kv_tokens * kv_bytes_per_token(ARCHS[m.model], 2))
    if m.load == "closed":
        values.update(concurrency=m.concurrency, rate=math.inf, think_time_ms=1000 * think_s)
    elif m.load == "open":
        values.update(rate=m.rate, duration_s=NEVER_S)
    else:
        values.update(rate=math.inf)
    return RunConfig(**values)


def replay(m: Measurement, model: StepModel, request_overhead_s: float = 0.0, blocks: bool = False,
           async_output: bool = False) -> Prediction:
    """Simulate the configuration with `model` (and, serving, its engine's front end); the published metrics as
    its benchmark computes them. The front end delays each request by its CPU time before the scheduler sees it
    (front_end): in arrival order for a burst or an open loop; for a closed loop as each client's wait before it
    sends (one client's request never queues behind another's there). `async_output`: the engine's outputs reach
    the client as `delivered` says."""
    overhead_s = request_overhead_s if m.serving else 0.0
    sent_s = arrivals(m)
    seen_s = sent_s + overhead_s if m.load == "closed" else front_end(sent_s, overhead_s, blocks)
    with tempfile.TemporaryDirectory(prefix="batchlab-published-") as tmp:
        preset = Path(tmp) / "model.yaml"
        save_preset(model, preset)
        offsets = np.zeros(len(sent_s)) if m.load == "closed" else seen_s
        tables = simulate(run_config(m, preset, overhead_s if m.load == "closed" else 0.0),
                          schedule_of(m, offsets))
    requests = delivered(tables.requests, tables.steps) if async_output else tables.requests
    delay_s = np.full(len(sent_s), overhead_s) if m.load == "closed" else seen_s - sent_s
    return Prediction(metrics_of(requests, m, delay_s), float(requests["completion_time"].max()))


def delivered(requests: pd.DataFrame, steps: pd.DataFrame, tolerance_s: float = 1e-9) -> pd.DataFrame:
    """A copy of a simulated run's requests table with the first and last token times (and TTFT, E2E) as the client
    of an engine with vLLM 0.6.0's asynchronous output processing sees them: the tokens of a step that prefilled
    reach it when the next step ends, when that next step prefilled too and began as this one ended; otherwise at
    their own step's end (before a decode step, or an idle engine, and every decode step's).

    0.6.0 processes a step's outputs while the next step runs, and its engine loop returns them when that step is
    done. The rule is read from Lambda's per-request first-token times (benchmarks/published/README.md): bursts of
    20 prompts (two prompt-only steps) get every first token in one group, and 40-prompt bursts in groups one step
    late, the last two steps' together; how 0.6.0 hands the last prompt step's outputs over before a multi-step
    decode round was not traced in its source. A run's requests are closed by the engine at their step's end
    (the scheduler's and a closed loop's view); only the client's times move."""
    out = requests.copy()
    if steps is None or steps.empty:  # no continuous step ran
        return out
    for worker, s in steps.sort_values(["worker", "step"]).groupby("worker"):
        prompt = s["prefill_tokens"].to_numpy() > 0
        start, end = s["start_time"].to_numpy(), s["end_time"].to_numpy()
        late = prompt[:-1] & prompt[1:] & (np.abs(start[1:] - end[:-1]) <= tolerance_s)
        source, target = end[:-1][late], end[1:][late]  # ascending: a worker's steps end in order
        if not len(source):
            continue
        mine = (out["worker"] == worker).to_numpy()
        for time_col, latency_col in (("first_token_time", "ttft"), ("completion_time", "e2e")):
            t = out.loc[mine, time_col].to_numpy()
            i = np.clip(np.searchsorted(source, t - tolerance_s), 0, len(source) - 1)
            moved = np.where(np.abs(source[i] - t) <= tolerance_s, target[i], t)  # NaN (no token) stays NaN
            out.loc[mine, latency_col] = out.loc[mine, latency_col].to_numpy() + (moved - t)
            out.loc[mine, time_col] = moved
    return out


def metrics_of(requests: pd.DataFrame, m: Measurement, delay_s: np.ndarray | None = None) -> dict[str, float]:
    """The published metrics of a simulated run's requests table; `delay_s`: each request's time between being
    sent and reaching the scheduler (the front end), added to its TTFT and E2E."""
    done = requests[requests["status"] == RequestStatus.FINISHED].sort_values("request_id")
    if len(done) < len(m.prompts):
        raise RuntimeError(f"{m.id}: {len(m.prompts) - len(done)} of {len(m.prompts)} requests did not finish")
    ids = done["request_id"].to_numpy()
    delay = np.zeros(len(m.prompts)) if delay_s is None else np.asarray(delay_s)
    empty = np.asarray(m.outputs)[ids] <= 0
    outputs = np.where(empty, 0, done["n_tokens"].to_numpy())
    ttft = done["ttft"].to_numpy() + delay[ids]
    e2e = done["e2e"].to_numpy() + delay[ids]
    # from the first send (t = 0) to the last completion; a closed loop's simulated clock starts at its first
    # requests reaching the scheduler, the front end's delay after they were sent
    duration_s = float(done["completion_time"].max()) + (float(delay.min()) if m.load == "closed" else 0.0)
    reported_ttft = np.where(empty, 0.0, ttft)
    many = outputs > 1
    tpot = (e2e[many] - ttft[many]) / (outputs[many] - 1)
    return {"throughput_req_s": len(done) / duration_s, "throughput_out_tok_s": float(outputs.sum()) / duration_s,
            "ttft_median_s": float(np.median(reported_ttft)), "ttft_mean_s": float(reported_ttft.mean()),
            "tpot_median_s": float(np.median(tpot)) if len(tpot) else math.nan,
            "tpot_mean_s": float(tpot.mean()) if len(tpot) else math.nan,
            "batch_latency_s": float(e2e.mean())}


def rows_of(m: Measurement, prediction: Prediction) -> list[PublishedPrediction]:
    """Each published figure of `m` beside its prediction."""
    return [PublishedPrediction(m.id, m.source, m.gpu, m.split, f.metric, f.value, prediction.metrics[f.metric],
                                f.scored)
            for f in m.figures]


# --- the error table's arithmetic ---------------------------------------------------------------------------
@dataclass(slots=True)
class GroupError:
    """|error| over one split's scored figures of one group."""

    group: str
    count: int
    median: float
    worst: float
    worst_row: str


def group_errors(rows: list[PublishedPrediction], split: str) -> list[GroupError]:
    """Median and worst |predicted ÷ published − 1| per group over the scored rows of `split` (groups with no
    row are left out)."""
    out = []
    for group in GROUP_ORDER:
        mine = [r for r in rows if r.split == split and r.scored and r.group == group]
        if not mine:
            continue
        worst = max(mine, key=lambda r: abs(r.error))
        out.append(GroupError(group, len(mine), statistics.median(abs(r.error) for r in mine), abs(worst.error),
                              f"{worst.measurement} {worst.metric}"))
    return out


def meets(errors: list[GroupError], median_bar: float, worst_bar: float) -> bool:
    """True when every group's median and worst |error| are within the bars."""
    return bool(errors) and all(e.median <= median_bar and e.worst <= worst_bar for e in errors)
