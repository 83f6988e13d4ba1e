"""The discrete-event simulator: the live scheduler's rules, driven by an event queue in virtual time.

Events are (time_s, seq, kind, payload) on a heap: a planned arrival, a policy wake-up, the end of a
static batch, the end of a continuous step. All events at one instant are applied, then the policy is
asked — per worker, least loaded first, with `WorkerState.capacity()` — exactly as
`scheduler.process.Scheduler._schedule` asks it; then idle continuous workers start a step.
Messages take no time, but a busy continuous worker, like worker/process.py, starts its next step the
moment the last one ends, with the rows dispatched before then: a row the scheduler dispatches in
answer to that step's finished rows (or at the same instant) joins the step after.

Times match a live run's (t0 = 0): planned arrival = schedule offset (send and receive times equal
it), scheduled_time = launch, first token = end of the prefill step, later tokens at step ends.
The collector's RunStore receives the same messages it would receive live, except Tokens (see record.py).
Not modelled: OOM (the `sim` backend has none, so no batch is requeued), lost workers, clock offsets.
"""
import heapq
import itertools

import numpy as np
import pandas as pd

from batchlab.collector.store import RunStore
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RequestFailed, RunEnd, RunInfo, Step, WorkerBye, WorkerHello
from batchlab.scheduler.policies import Policy, QueuedRequest
from batchlab.scheduler.workers import PendingQueue, WorkerState, least_loaded
from batchlab.scheduler.simulator.continuous import FastContinuousCore, StepPlan
from batchlab.scheduler.simulator.record import Recorder
from batchlab.worker.backend import Row
from batchlab.worker.sim import static_step_durations
from batchlab.worker.stepmodel import StepModel

ARRIVAL, WAKE, BATCH_END, STEP_END = range(4)


class Simulation:
    """One run in virtual time: requests (a schedule frame) → policy → modelled workers → RunStore."""

    def __init__(self, policy: Policy, model: StepModel, hellos: list[WorkerHello], requests: pd.DataFrame,
                 *, settings: dict, max_queue: int = 0, max_queue_tokens: int = 0) -> None:
        self.policy, self.model, self.settings = policy, model, settings
        self.max_queue, self.max_queue_tokens = max_queue, max_queue_tokens
        self.store, self.recorder = RunStore(), Recorder()
        # the queue holds QueuedRequest: the policy's view and all that WorkerState.capacity() reads
        self.workers = {h.worker_id: WorkerState(h, 0.0) for h in hellos}
        self.cores = {h.worker_id: FastContinuousCore(model) for h in hellos if h.mode == "continuous"}
        self.stepping: dict[str, tuple[float, int, StepPlan]] = {}  # worker -> (start_s, step, plan)
        self.admitted: dict[int, tuple[int, float, int]] = {}  # rid -> (batch_id, admit_s, output_len)
        self.queue = PendingQueue()
        self.requests = list(zip(requests["request_id"].tolist(), requests["arrival_offset_s"].tolist(),
                                 requests["prompt_len"].tolist(), requests["output_len"].tolist()))
        self.events = [(r[1], i, ARRIVAL, i) for i, r in enumerate(self.requests)]
        heapq.heapify(self.events)
        self.seq = itertools.count(len(self.events))
        self.wakes: set[float] = set()
        self.eos, self.next_batch_id = not self.requests, 0
        self.stats = {"submitted": 0, "rejected_messages": 0, "queue_full": 0, "oom_batches": 0,
                      "workers_lost": 0, "max_queue_len": 0}

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> RunStore:
        """Play every event; return the store (tokens still in the recorder: see `Recorder.attach`)."""
        self._run_info()
        t = 0.0
        while self.events:
            t, changed = self.events[0][0], False
            # 1. apply everything that happens at this instant
            while self.events and self.events[0][0] == t:
                _, _, kind, payload = heapq.heappop(self.events)
                changed |= self._apply(kind, payload, t)
            # 2. let the policy launch batches on workers with room (only a change can alter its answer)
            if changed:
                self._schedule(t)
            # 3. idle continuous workers with admitted rows start a step
            self._start_steps(t)
        self._finish(t)
        return self.store

    def _push(self, time_s: float, kind: int, payload: object) -> None:
        heapq.heappush(self.events, (time_s, next(self.seq), kind, payload))

    def _apply(self, kind: int, payload, t: float) -> bool:
        if kind == ARRIVAL:
            self._arrive(payload, t)
            return True
        if kind == WAKE:
            self.wakes.discard(t)
            return True
        if kind == BATCH_END:
            wid, batch_id, start_s = payload
            rids = [r.request_id for r in self.workers[wid].inflight[batch_id]]
            self._done(BatchDone(batch_id, wid, start_s, t, rids))
            return True
        return self._end_step(payload, t)

    # --- scheduler side ---------------------------------------------------------------------------
    def _run_info(self) -> None:
        hellos = {w: {"backend": s.hello.backend, "model": s.hello.model, "mode": s.hello.mode,
                      "device": s.hello.device, "max_batch_size": s.hello.max_batch_size,
                      "kv_budget_bytes": s.hello.kv_budget_bytes} for w, s in self.workers.items()}
        self.store.handle(RunInfo({**self.settings, "t0": 0.0, "workers": hellos}))

    def _arrive(self, index: int, t: float) -> None:
        rid, _, prompt_len, output_len = self.requests[index]
        self.stats["submitted"] += 1
        self.store.handle(Arrival(rid, t, t, t, prompt_len, output_len))
        if index == len(self.requests) - 1:  # traffic's EndOfStream follows its last request
            self.eos = True
            self.stats["sent_by_traffic"] = len(self.requests)
        if self.queue.is_full_for(prompt_len + output_len, self.max_queue, self.max_queue_tokens):
            self.stats["queue_full"] += 1
            self.store.handle(RequestFailed(rid, "queue full", t))
            return
        self.queue.append(QueuedRequest(rid, t, prompt_len, output_len))
        self.stats["max_queue_len"] = max(self.stats["max_queue_len"], len(self.queue))

    def _schedule(self, t: float) -> None:
        """scheduler.process.Scheduler._schedule, in virtual time."""
        if not self.queue:
            return
        for wid in least_loaded(self.workers) if len(self.workers) > 1 else self.workers:
            if not self.queue:
                return
            state = self.workers[wid]
            view = list(itertools.islice(self.queue, max(state.hello.max_batch_size, 1)))
            decision = self.policy.decide(view, t, state.capacity(), self.eos)
            if decision.n:
                self._launch(wid, [self.queue.popleft() for _ in range(decision.n)], decision.reason, t)
            elif decision.wake_at is not None and decision.wake_at > t and decision.wake_at not in self.wakes:
                self.wakes.add(decision.wake_at)
                self._push(decision.wake_at, WAKE, None)

    def _launch(self, wid: str, batch: list[QueuedRequest], reason: str, t: float) -> None:
        state = self.workers[wid]
        continuous = state.hello.mode == "continuous"
        for group in ([r] for r in batch) if continuous else [batch]:
            batch_id, self.next_batch_id = self.next_batch_id, self.next_batch_id + 1
            state.start(batch_id, group)
            self.store.handle(BatchLaunch(batch_id, wid, t, reason, [r.request_id for r in group],
                                          len(self.queue)))
            if continuous:
                self.admitted[group[0].request_id] = (batch_id, t, group[0].output_len)
                self.cores[wid].admit(group[0].request_id, group[0].prompt_len, group[0].output_len)
            else:
                self._run_static(wid, batch_id, group, t)

    def _done(self, done: BatchDone) -> None:
        """A worker's BatchDone: to the collector, and the scheduler frees the worker's room."""
        self.store.handle(done)
        state = self.workers[done.worker_id]
        batch = state.end(done.batch_id)
        state.batches_done += 1
        self.policy.on_batch_done(len(batch), done.oom)

    def _finish(self, t: float) -> None:
        for r in self.queue:  # nothing may vanish (no policy leaves requests behind, but be sure)
            self.store.handle(RequestFailed(r.request_id, "scheduler stopped: simulation ended", t))
        self.store.handle(RunEnd(self.stats["submitted"], list(self.workers), dict(self.stats)))
        for wid in self.workers:
            self.store.handle(WorkerBye(wid, 0, "none", {"rejected_messages": 0}))

    # --- worker side ------------------------------------------------------------------------------
    def _run_static(self, wid: str, batch_id: int, group: list[QueuedRequest], t: float) -> None:
        """worker.sim.SimBackend.run_batch: step ends are the launch time plus the step durations."""
        rows = [Row(r.request_id, r.prompt_len, r.output_len, [], batch_id) for r in group]
        ends_s = np.add.accumulate(np.array([t, *static_step_durations(rows, self.model)]))[1:]
        self.recorder.static_batch(batch_id, [(r.request_id, r.output_len) for r in group], ends_s)
        self._push(float(ends_s[-1]), BATCH_END, (wid, batch_id, t))

    def _start_steps(self, t: float) -> None:
        """Idle continuous workers that were just given rows start a step."""
        for wid, core in self.cores.items():
            if wid not in self.stepping and core.has_work():
                self._start_step(wid, t)

    def _start_step(self, wid: str, t: float) -> None:
        step, plan = self.cores[wid].step_no, self.cores[wid].plan_step()
        for rid in plan.joined:
            batch_id, _, output_len = self.admitted[rid]
            self.recorder.joined(wid, rid, batch_id, output_len)
        self.stepping[wid] = (t, step, plan)
        self._push(t + plan.duration_s, STEP_END, wid)

    def _end_step(self, wid: str, t: float) -> bool:
        start_s, step, plan = self.stepping.pop(wid)
        self.recorder.step_end(wid, t)
        self.store.handle(Step(wid, step, start_s, t, plan.running, len(plan.joined), len(plan.finished)))
        for rid in plan.finished:
            batch_id, admit_s, _ = self.admitted.pop(rid)
            self._done(BatchDone(batch_id, wid, admit_s, t, [rid]))
        if self.cores[wid].has_work():  # like worker/process.py: the next step starts at once, with the
            self._start_step(wid, t)  # rows dispatched before now; the scheduler's answer joins later
        return bool(plan.finished)
