"""Build the run's tables from a RunStore's state, as the store hands it over (collector.store_view).

One time vocabulary: a message's `*_time`/`time` field (and an engine's `*_ts` stamp) is a process-clock
stamp on the scheduler's clock; a table's `*_time`/`time` column is seconds since the run's t0
(RunInfo.settings["t0"]). The conversion happens here, once; latencies (`ttft`, `e2e`, ...) and `*_s`
values are durations in seconds.
"""
import numpy as np
import pandas as pd

from batchlab.collector import request
from batchlab.collector.parts import Tables  # declared with its writer; built here
from batchlab.collector.request import NAN, RequestOutcome, RequestState
from batchlab.collector.store_view import StoreView
from batchlab.collector.summary import Summary
from batchlab.protocol.status import FailureReason, RequestStatus
from batchlab.stats.metrics import summarize, useful_fraction

ENGINE_METRICS = "request_metrics"  # WorkerBye.stats key: {request_id (str): {name: value}}
TOKEN_DTYPES = {"request_id": "int64", "token_index": "int64", "token_id": "int64", "time": "float64",
                "batch_id": "int64"}
BATCH_DTYPES = {
    "batch_id": "int64", "worker": "str", "size": "int64", "launch_reason": "str",
    "scheduled_time": "float64", "start_time": "float64", "completion_time": "float64",
    "queue_len": "int64", "max_prompt_len": "int64", "max_output_len": "int64",
    "useful_fraction": "float64", "oom": "bool", "peak_memory_bytes": "int64",
}
STEP_DTYPES = {"worker": "str", "step": "int64", "start_time": "float64", "end_time": "float64",
               "running": "int64", "joined": "int64", "finished": "int64", "prefill_tokens": "int64",
               "prefill_rows": "int64", "prefill_width": "int64", "prefill_pairs": "int64"}
CPU_STAT = "cpu_s"  # RunEnd.stats / WorkerBye.stats key: that process's own CPU time (user + system), s


def frame(rows: list[dict], dtypes: dict[str, str]) -> pd.DataFrame:
    """Rows (each by column name) → a DataFrame with fixed columns and dtypes (so every part has the same schema)."""
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def _worker_of(view: StoreView, batch_id: int) -> str:
    launch, done = view.launches.get(batch_id), view.dones.get(batch_id)
    return launch.worker_id if launch else (done.worker_id if done else "")


def _request_row(view: StoreView, state: RequestState, t0: float) -> RequestOutcome:
    """A request's row as known now, its counting attempt's; one without a terminal record is failed."""
    bid = view.counting_batch(state)
    n_tokens, first, last = view.token_stats(state, bid)
    launch, status = view.launches.get(bid), state.status or RequestStatus.FAILED
    row = RequestOutcome(
        request_id=state.request_id, status=status, error=state.error if state.status else FailureReason.NO_TERMINAL,
        scheduled_time=launch.scheduled_time - t0 if launch else NAN,
        first_token_time=first - t0 if n_tokens else NAN,
        completion_time=last - t0 if n_tokens and status == RequestStatus.FINISHED else NAN,
        n_tokens=n_tokens, batch_id=bid, worker=_worker_of(view, bid), attempts=len(state.batches), submitted=True)
    if state.arrival is not None:  # else its Arrival is still on its way: the fields' defaults
        a = state.arrival.request
        for name in request.REQUEST_COLUMNS:  # as its RequestMsg declares them; a message's time → a table's
            value = getattr(a, name)
            setattr(row, name, value - t0 if name.endswith("_time") else value)
        row.recv_time = state.arrival.recv_time - t0  # at the scheduler
    return row


def requests_frame(view: StoreView, rids: list[int], t0: float,
                   schedule: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per request in `rids` (plus unsent schedule rows), with the run's settings."""
    df = request.table([_request_row(view, view.requests[rid], t0) for rid in rids])
    unsent = request.unsent_table(schedule, view.requests) if schedule is not None else df.iloc[:0]
    if len(unsent):
        df = pd.concat([df, unsent], ignore_index=True).sort_values("request_id", kind="stable", ignore_index=True)
    return request.with_settings(df, view.settings)


def tokens_frame(view: StoreView, rids: list[int], t0: float) -> pd.DataFrame:
    """The counting attempt's held tokens of each request in `rids`, indexed in arrival order."""
    cols: dict[str, list[np.ndarray]] = {name: [] for name in TOKEN_DTYPES}
    for rid in rids:
        state = view.requests[rid]
        bid = view.counting_batch(state)
        buf = view.tokens.get((rid, bid))
        if not buf:
            continue
        n, start = len(buf), state.taken[0] if bid == state.taken_batch else 0  # after the tokens already taken
        cols["request_id"].append(np.full(n, rid, dtype=np.int64))
        cols["token_index"].append(np.arange(start, start + n, dtype=np.int64))
        cols["token_id"].append(np.asarray(buf.ids, dtype=np.int64))
        cols["time"].append(np.asarray(buf.times, dtype=np.float64) - t0)
        cols["batch_id"].append(np.full(n, bid, dtype=np.int64))
    if not cols["time"]:
        return frame([], TOKEN_DTYPES)
    return pd.DataFrame({name: np.concatenate(arrays) for name, arrays in cols.items()}).astype(TOKEN_DTYPES)


def _batch_row(view: StoreView, bid: int, t0: float) -> dict:
    launch, done = view.launches.get(bid), view.dones.get(bid)
    if launch is not None:
        rids = launch.requests_in(bid)
    else:
        rids = list(done.finished) + [r.request_id for r in done.failed]
    arrivals = [view.requests[r].arrival for r in rids if r in view.requests]
    arrivals = [a.request for a in arrivals if a is not None]
    outs = [a.output_len for a in arrivals]
    return dict(
        batch_id=bid, worker=_worker_of(view, bid), size=len(rids), launch_reason=launch.reason if launch else "",
        scheduled_time=launch.scheduled_time - t0 if launch else NAN,
        start_time=done.start_time - t0 if done else NAN, completion_time=done.end_time - t0 if done else NAN,
        queue_len=launch.queue_len if launch else 0, max_prompt_len=max((a.prompt_len for a in arrivals), default=0),
        max_output_len=max(outs, default=0), useful_fraction=useful_fraction(outs), oom=bool(done and done.oom),
        peak_memory_bytes=done.peak_memory_bytes if done else 0,
    )


def batches_frame(view: StoreView, bids: list[int], t0: float) -> pd.DataFrame:
    """One row per batch in `bids` (launched, done, or both)."""
    return frame([_batch_row(view, bid, t0) for bid in bids], BATCH_DTYPES)


def steps_frame(steps: list, t0: float) -> pd.DataFrame:
    """One row per continuous-mode engine step."""
    return frame([dict(worker=s.worker_id, step=s.step, start_time=s.start_time - t0, end_time=s.end_time - t0,
                       running=s.running, joined=s.joined, finished=s.finished, prefill_tokens=s.prefill_tokens,
                       prefill_rows=s.prefill_rows, prefill_width=s.prefill_width, prefill_pairs=s.prefill_pairs)
                  for s in steps], STEP_DTYPES)


def run_facts(view: StoreView) -> dict:
    """Summary fields that come from the store, not the tables."""
    peaks = [b.peak_memory_bytes for b in view.byes.values()] + [view.peak_memory_bytes]
    kinds = sorted({b.memory_kind for b in view.byes.values() if b.memory_kind})
    end = view.run_end
    return {
        **view.counters, "peak_memory_bytes": max(peaks), "memory_kind": ",".join(kinds) or "unknown",
        "submitted_by_scheduler": end.submitted if end else None,
        "scheduler_stats": dict(end.stats) if end else {},
        "worker_stats": {w: {k: v for k, v in b.stats.items() if k != ENGINE_METRICS}
                         for w, b in view.byes.items()},
        "workers_without_bye": [w for w in (end.workers if end else []) if w not in view.byes],
    }


def harness_cpu(view: StoreView, collector_cpu_s: float) -> dict:
    """The harness's own CPU time (s) by role and per submitted request (µs): the collector's always;
    the scheduler's and each worker's where their RunEnd / WorkerBye stats carry CPU_STAT (a model
    worker's CPU is its engine's as well as the harness's)."""
    end = view.run_end
    roles = {"collector": float(collector_cpu_s)}
    for role, msg in [("scheduler", end), *sorted(view.byes.items())]:
        if msg is not None and isinstance(msg.stats.get(CPU_STAT), (int, float)):
            roles[role] = float(msg.stats[CPU_STAT])
    n = end.submitted if end is not None and end.submitted else view.arrivals
    per_us = {role: 1e6 * cpu_s / n if n else None for role, cpu_s in roles.items()}
    return {"cpu_s": roles, "us_per_request": per_us, "requests": n,
            "total_us_per_request": 1e6 * sum(roles.values()) / n if n else None}


def bye_engine_metrics(view: StoreView) -> dict[int, dict]:
    """The engine figures older workers sent in their bye, by request id."""
    return {int(rid): m for b in view.byes.values() for rid, m in b.stats.get(ENGINE_METRICS, {}).items()}


def engine_column(key: str) -> str:
    """The requests table's column for an engine figure: a stamp `<name>_ts` becomes engine_<name>_time."""
    return f"engine_{key.removesuffix('_ts')}_time" if key.endswith("_ts") else f"engine_{key}"


def engine_columns(requests: pd.DataFrame, per_request: dict[int, dict], t0: float) -> pd.DataFrame:
    """The engine's own per-request figures (vLLM: queued/scheduled/first/last token stamps, cached
    tokens), sent with each completion (older workers: in their bye), as engine_* columns; a stamp
    (scheduler clock) becomes a time since t0."""
    for key in sorted({k for m in per_request.values() for k in m}):
        values = requests.request_id.map(lambda r: per_request.get(r, {}).get(key, NAN)).astype("float64")
        requests[engine_column(key)] = values - t0 if key.endswith("_ts") else values
    return requests


def prefix_cache(requests: pd.DataFrame) -> dict:
    """How much of the prompts an engine's prefix cache served (where the engine reports it: vLLM),
    over finished requests; {} when no engine reported it."""
    if "engine_cached_tokens" not in requests:
        return {}
    done = requests[requests.engine_cached_tokens.notna()]
    cached, prompt = float(done.engine_cached_tokens.sum()), float(done.prompt_len.sum())
    return {"prefix_cache": {"cached_prompt_tokens": int(cached), "prompt_tokens": int(prompt),
                             "hit_rate": cached / prompt if prompt else None}}


def requests_table(view: StoreView, schedule: pd.DataFrame | None = None) -> pd.DataFrame:
    """build_tables' requests table alone, its engine columns included (a capacity probe's verdict reads no other)."""
    t0 = view.t0
    return engine_columns(requests_frame(view, sorted(view.requests), t0, schedule),
                          bye_engine_metrics(view) | view.engine_metrics, t0)


def build_tables(view: StoreView, schedule: pd.DataFrame | None, slos: dict | None,
                 tokens: pd.DataFrame | None = None) -> Tables:
    """Every final table and the summary, from memory (a store whose rows were never taken: the
    simulator, tests; the collector merges its part files instead, collector.merge). `tokens`: the
    caller built that table already (the simulator)."""
    t0 = view.t0
    rids = sorted(view.requests)
    requests = requests_table(view, schedule)
    tokens = tokens_frame(view, rids, t0) if tokens is None else tokens
    steps = steps_frame(view.steps, t0) if view.steps else None
    batches = batches_frame(view, sorted(set(view.launches) | set(view.dones)), t0)
    summary = Summary.model_validate(summarize(requests, tokens, view.settings, slos) | run_facts(view)
                                     | prefix_cache(requests))
    return Tables(requests, tokens, batches, steps, summary)
