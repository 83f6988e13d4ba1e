"""One simulated run from a RunConfig: the live run's schedule, policy and step model in virtual time.
Pure: it writes no file (lab.simulate writes a run folder from its tables).

`Simulation` is the discrete-event simulator: the live scheduler's core (scheduler/core.py), driven by an
event queue in virtual time.

Events are (time_s, seq, kind, payload) on a heap: a planned arrival, a wake-up, the end of a static
batch, the end of a continuous step. All events at one instant are applied, then the core schedules
(only a change can alter its answer; a wake-up counts as one), as the live process asks it after each
poll; then idle continuous workers start a step. One wake-up event is pushed per distinct wake time.
Messages take no time, but a busy continuous worker, like worker/process.py, starts its next step the
moment the last one ends, with the rows dispatched before then: a row the scheduler dispatches in
answer to that step's finished rows (or at the same instant) joins the step after.

Times match a live run's (t0 = 0): planned arrival = schedule offset (send and receive times equal
it), scheduled_time = launch, first token = end of the prefill step, later tokens at step ends.
The collector's RunStore receives the same messages it would receive live, except Tokens (see record.py).
Closed loop (`clients`, a traffic.closed_loop.ClientPool): no planned arrival; each client's request
arrives at 0, then when its last one ended (the BatchDone, or the core's failure) plus the think time.
Not modelled: OOM (the `sim` backend has none, so no batch is requeued), lost workers, clock offsets.
"""
import heapq
import itertools
from dataclasses import replace

import numpy as np
import pandas as pd

from batchlab.collector.store import RunStore
from batchlab.collector.tables import Tables, build_tables, requests_table
from batchlab.protocol import (Arrival, BatchDone, RequestMsg, RequestRow, RunEnd, RunInfo, Step, WorkerBye,
                               WorkerHello)
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.identity import config_hash, run_settings
from batchlab.protocol.settings import RunConfig
from batchlab.protocol.status import FailureKind, detailed
from batchlab.scheduler.core import SchedulerCore
from batchlab.scheduler.launch import Launch
from batchlab.scheduler.policies import Policy
from batchlab.scheduler.strategies import Strategy, resolve
from batchlab.simulator.record import Recorder
from batchlab.traffic.closed_loop import ClientPool
from batchlab.traffic.schedule import Schedule
# worker_hello: the one hello builder (one sim BackendInfo)
from batchlab.worker.backend import BackendRequest, worker_hello
from batchlab.worker.sim import SimBackend, StepPlan, make_core, static_step_durations, step_ends
from batchlab.worker.stepmodel import StepModel

ARRIVAL, WAKE, BATCH_END, STEP_END, CLIENT = range(5)


class Simulation:
    """One run in virtual time: requests (a schedule frame) → SchedulerCore → modelled workers → RunStore."""

    def __init__(self, policy: Policy, model: StepModel, hellos: list[WorkerHello], requests: pd.DataFrame,
                 *, settings: dict, max_queue: int = 0, max_queue_tokens: int = 0,
                 stall_limit_s: float = 0.0, clients: ClientPool | None = None,  # 0: no stall limit
                 noise=None) -> None:  # the machine's slowdown over the run (worker.machine_noise), None: none
        self.model, self.settings, self.noise = model, settings, noise
        self.store, self.recorder = RunStore(), Recorder()
        self.core = SchedulerCore(policy, max_queue=max_queue, max_queue_tokens=max_queue_tokens,
                                  stall_limit_s=stall_limit_s)
        for h in hellos:
            self.core.on_hello(h.worker_id, h, 0.0)
        self.steppers = {h.worker_id: make_core(model, h.max_batch_size, h.kv_budget_bytes)
                         for h in hellos if h.mode == BatchingMode.CONTINUOUS}
        self.stepping: dict[str, tuple[float, StepPlan]] = {}  # worker -> (start_s, plan)
        self.admitted: dict[int, tuple[RequestRow, float]] = {}  # rid -> (its row, admit_s)
        # as traffic would send them, planned (and sent) at their offsets (t0 = 0); a closed loop's, when it can
        self.requests = [RequestMsg(rid, offset_s, offset_s, prompt_len, output_len)
                         for rid, offset_s, prompt_len, output_len in zip(
                             requests["request_id"].tolist(), requests["arrival_offset_s"].tolist(),
                             requests["prompt_len"].tolist(), requests["output_len"].tolist())]
        self.clients = clients  # closed loop: arrivals decided as requests end
        self.events = [] if clients else [(r.arrival_time, i, ARRIVAL, i) for i, r in enumerate(self.requests)]
        heapq.heapify(self.events)
        self.seq = itertools.count(len(self.events))
        if clients is not None:
            clients.start(0.0)
            self._push(0.0, CLIENT, None)
        self.wakes: set[float] = set()
        self.stats = {"rejected_messages": 0}  # what a live run's edge counts (nothing is malformed here)
        if not self.requests:
            self.core.end_of_stream()

    # --- main loop --------------------------------------------------------------------------------
    def run(self) -> RunStore:
        """Play every event; return the store (tokens still in the recorder: see `Recorder.attach`)."""
        self.store.handle(RunInfo({**self.settings, "t0": 0.0, "workers": self.core.workers_info()}))
        t = 0.0
        while self.events:
            t, changed = self.events[0][0], False
            # 1. apply everything that happens at this instant
            while self.events and self.events[0][0] == t:
                _, _, kind, payload = heapq.heappop(self.events)
                changed |= self._apply(kind, payload, t)
            changed |= self._end_closed_stream(t)
            # 2. the core launches batches on workers with room (only a change can alter its answer)
            if changed:
                self._schedule(t)
            # 3. idle continuous workers with admitted rows start a step
            for wid, stepper in self.steppers.items():
                if wid not in self.stepping and stepper.has_work():
                    self._start_step(wid, t)
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
        if kind == CLIENT:
            due = self.clients.due(t)
            for index, _ in due:
                self._arrive(index, t)
            return bool(due)
        if kind == BATCH_END:
            wid, batch_id, start_s = payload
            rids = [r.request_id for r in self.core.workers[wid].inflight[batch_id]]
            self._done(BatchDone(batch_id, wid, start_s, t, rids))
            return True
        return self._end_step(payload, t)

    # --- scheduler side ---------------------------------------------------------------------------
    def _arrive(self, index: int, t: float) -> None:
        request = replace(self.requests[index], arrival_time=t, send_time=t)
        self.store.handle(Arrival(request, t))
        if index == len(self.requests) - 1:  # traffic's EndOfStream follows its last request
            self.core.end_of_stream()
            self.stats["sent_by_traffic"] = len(self.requests)
        self.core.on_request(request, t)
        self._forward()

    def _schedule(self, t: float) -> None:
        """Carry out the core's launches; ask to be woken when it wants to be asked again."""
        decisions = self.core.schedule(t)
        for launch in decisions.launches:
            self.store.handle(launch.record(t))
            if launch.worker_id in self.steppers:
                self._admit(launch, t)
            else:
                self._run_static(launch, t)
        wake = decisions.wake_at
        if wake is not None and wake > t and wake not in self.wakes:
            self.wakes.add(wake)
            self._push(wake, WAKE, None)

    def _done(self, done: BatchDone) -> None:
        """A worker's BatchDone: to the collector, and the core frees the worker's room."""
        self.store.handle(done)
        batch = self.core.on_batch_done(done.worker_id, done.batch_id, done.oom, done.end_time)
        if batch is not None and not done.oom:
            self._ended([r.request_id for r in batch], done.end_time)
        self._forward()

    def _forward(self) -> None:
        records = self.core.drain()
        for record in records:
            self.store.handle(record)
        if records:
            self._ended([r.request_id for r in records], records[-1].time)

    def _ended(self, request_ids: list[int], t: float) -> None:
        """Closed loop: these requests' clients send again after the think time (an event each, before the stop)."""
        if self.clients is None:
            return
        for ready_s in self.clients.on_ended(request_ids, t):
            if ready_s < self.clients.stop_at:
                self._push(ready_s, CLIENT, None)

    def _end_closed_stream(self, t: float) -> bool:
        """Closed loop: the stream ends once no client will send again (schedule or duration run out)."""
        if self.clients is None or self.core.eos or not self.clients.done(t):
            return False
        self.core.end_of_stream()
        self.stats["sent_by_traffic"] = self.clients.next_index
        return True

    def _finish(self, t: float) -> None:
        """No event is left: requests still queued wait on idle workers for a policy that will never launch
        them, so the core declares it stalled as a live scheduler would, stall_limit_s (virtual) later."""
        if self.core.stall_limit_s:
            self.core.tick(t)
            self.core.tick(t + self.core.stall_limit_s)
        self.core.fail_queue(detailed(FailureKind.SCHEDULER_STOPPED, "simulation ended"), t)  # with the limit off (0)
        self._forward()
        stats = {**self.core.stats, **self.stats}
        self.store.handle(RunEnd(self.core.stats["submitted"], list(self.core.workers), stats))
        for wid in self.core.workers:
            self.store.handle(WorkerBye(wid, 0, "none", {"rejected_messages": 0}))

    # --- worker side ------------------------------------------------------------------------------
    def _run_static(self, launch: Launch, t: float) -> None:
        """worker.sim.SimBackend.run_batch: step ends are the launch time plus the step durations."""
        rows = [BackendRequest.of(r) for r in launch.rows]  # a static launch is one batch
        batch_id = rows[0].batch_id
        ends_s = np.array(step_ends(t, static_step_durations(rows, self.model), self.noise))
        self.recorder.static_batch(batch_id, [(r.request_id, r.output_len) for r in rows], ends_s)
        self._push(float(ends_s[-1]), BATCH_END, (launch.worker_id, batch_id, t))

    def _admit(self, launch: Launch, t: float) -> None:
        """worker.sim.SimBackend.admit: each row joins the worker's next step."""
        for row in launch.rows:
            r = row.request
            self.admitted[r.request_id] = (row, t)
            self.steppers[launch.worker_id].admit(r.request_id, r.prompt_len, r.output_len)

    def _start_step(self, wid: str, t: float) -> None:
        stepper = self.steppers[wid]
        plan = stepper.plan_step()
        for rid in plan.joined if stepper.every_step else ():  # else its finishers' steps come with the plan
            row, _ = self.admitted[rid]
            self.recorder.joined(wid, rid, row.batch_id, row.request.output_len)
        self.stepping[wid] = (t, plan)
        self._push(step_ends(t, [plan.duration_s], self.noise)[0], STEP_END, wid)

    def _end_step(self, wid: str, t: float) -> bool:
        start_s, plan = self.stepping.pop(wid)
        self.recorder.step_end(wid, t)
        self.store.handle(Step(wid, plan.step, start_s, t, plan.running, len(plan.joined), len(plan.finished),
                               plan.prefill_tokens, plan.prefill_rows, plan.prefill_width, plan.prefill_pairs))
        for rid in plan.finished:
            row, admit_s = self.admitted.pop(rid)
            if rid in plan.token_steps:
                self.recorder.at_steps(wid, rid, row.batch_id, plan.token_steps[rid])
            self._done(BatchDone(row.batch_id, wid, admit_s, t, [rid]))
        if self.steppers[wid].has_work():  # like worker/process.py: the next step starts at once, with the
            self._start_step(wid, t)  # rows dispatched before now; the scheduler's answer joins later
        return bool(plan.finished)


END_REASON = "simulated"


def sim_worker(cfg: RunConfig, strategy: Strategy) -> SimBackend:
    """The live `sim` worker of this config (worker.sim.SimBackend.from_config: its step model and info);
    for --backend echo, one that plays the echo backend's zero-time preset and reports as `echo`, with the
    run's per-step token budget and speed factor (--speed-noise) all the same. A run on the vllm backend holds
    --max-num-seqs rows, as the live vLLM worker announces (worker.vllm_engine), when it is set."""
    echo = cfg.backend == "echo"
    rows = cfg.max_num_seqs if cfg.backend == "vllm" and cfg.max_num_seqs else strategy.rows
    worker = SimBackend.from_config(cfg.model_copy(update={"preset": "echo"}) if echo else cfg, strategy.mode, rows)
    worker.info.backend = "echo" if echo else "sim"
    return worker


def sim_settings(cfg: RunConfig) -> dict:
    """The settings a live run writes (protocol.identity.run_settings), marked as simulated."""
    settings = run_settings(cfg)
    settings.update(backend="echo" if cfg.backend == "echo" else "sim", simulated=True)
    settings["config_hash"] = config_hash(settings)  # of what it is: a simulation
    return settings


def simulate(cfg: RunConfig, schedule: Schedule, *, slos: dict | None = None, noise=None) -> Tables:
    """Play `schedule` through cfg's policy and workers in virtual time; the run's tables. `noise`: the
    machine's slowdown over the run (worker.machine_noise; default the run's own settings', as the live sim
    worker plays them)."""
    sim, store = _played(cfg, schedule, noise)
    tokens = sim.recorder.attach(store)
    # as live; every schedule row arrives in virtual time, so there are no unsent rows to add from the schedule
    tables = build_tables(store.view(), None, slos if slos is not None else cfg.slos() or None, tokens=tokens)
    tables.summary.end_reason = END_REASON
    return tables


def simulate_requests(cfg: RunConfig, schedule: Schedule, *, noise=None) -> pd.DataFrame:
    """simulate(cfg, schedule).requests, without the other tables: a capacity probe's verdict reads no other, and a
    twin's 600 s probe spent a fifth of its time building them (its tokens, batches and steps, its summary)."""
    sim, store = _played(cfg, schedule, noise)
    sim.recorder.hold_in(store)
    return requests_table(store.view())


def _played(cfg: RunConfig, schedule: Schedule, noise) -> tuple[Simulation, RunStore]:
    """The simulation of `schedule` under cfg, played to its end, and its store (tokens still in its recorder)."""
    strategy = resolve(cfg)
    worker = sim_worker(cfg, strategy)
    noise = noise if noise is not None else worker.noise
    # closed loop (--concurrency): the clients over the schedule, stopped at its duration; None: open loop
    clients = (ClientPool(cfg.concurrency, schedule.n_requests, cfg.think_time_ms / 1000, schedule.duration_s)
               if cfg.concurrency > 0 else None)
    hellos = [worker_hello(f"worker-{i}", worker.info) for i in range(cfg.workers)]  # as the live workers send
    sim = Simulation(strategy.policy(), worker.model, hellos, schedule.frame,
                     settings=sim_settings(cfg), max_queue=cfg.max_queue, max_queue_tokens=cfg.max_queue_tokens,
                     stall_limit_s=cfg.stall_limit_s, clients=clients, noise=noise)
    return sim, sim.run()
