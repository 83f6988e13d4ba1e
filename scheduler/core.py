"""The scheduler's rules, pure: events in, decisions out. No sockets, no clock, no logging.

    events     on_hello, on_back, on_request, on_batch_done, on_capacity, on_worker_lost, on_send_failed,
               end_of_stream, tick (the no-worker grace and the stall limit)
    decisions  schedule(now) -> Decisions(launches, wake_at)
    records    drain() -> the terminal RequestFailed records it decided, for the collector

Every method is given the time (`now`, seconds): the ZeroMQ process (scheduler/process.py) passes its
monotonic clock, the simulator (simulator/run.py) virtual time, benchmarks/compare_cpu.py
its own. A request the core holds leaves it launched (the worker then decides how it ends) or failed:
nothing vanishes.
"""
import itertools

from batchlab.protocol import RequestFailed, RequestMsg, RequestRow, WorkerHello
from batchlab.protocol.ids import IdSet
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.status import FailureKind, FailureReason, detailed
from batchlab.scheduler.launch import Decisions, Launch
from batchlab.scheduler.policies import Decision, Policy
from batchlab.scheduler.workers import PendingQueue, WorkerState, least_loaded

MAX_LOSSES = 1  # a request lost with its worker is requeued this often, then failed
WORKER_REJOIN_GRACE_S = 10.0  # with no worker left, queued requests wait this long for one to (re)join

STALLED = "policy launched nothing for {limit_s:g} s with {queued} queued and every worker idle"  # FailureKind.STALLED


class SchedulerCore:
    """The queue, each worker's room, the policy, and what happens to a request when things go wrong."""

    def __init__(self, policy: Policy, *, max_queue: int = 0, max_queue_tokens: int = 0,
                 stall_limit_s: float = 0.0) -> None:
        self.policy = policy
        self.stall_limit_s = stall_limit_s  # 0: a policy may sit on a queue forever
        self.idle_since: float | None = None  # since when the stream ended with requests queued, workers idle
        self.max_queue, self.max_queue_tokens = max_queue, max_queue_tokens  # 0: unbounded
        self.queue = PendingQueue()
        self.workers: dict[str, WorkerState] = {}
        self.eos = False  # traffic sent its last request
        self.next_batch_id = 0
        self.orphaned_since: float | None = None  # when the last worker was lost
        self.lost: dict[str, dict[int, list[RequestMsg]]] = {}  # a lost worker's batches (it may be stalled)
        self.losses: dict[int, int] = {}  # request_id -> times its worker was lost while it ran
        self.outbox: list[RequestFailed] = []  # terminal records not yet drained
        self.seen = IdSet()  # every request id received: one that comes again is refused
        self.stats = {"submitted": 0, "duplicate_requests": 0, "queue_full": 0, "oom_batches": 0, "workers_lost": 0,
                      "workers_rejoined": 0, "capacity_changes": 0, "max_queue_len": 0, "launches_clamped": 0,
                      "rows_clamped": 0}

    # --- events in ----------------------------------------------------------------------------------
    def on_hello(self, worker_id: str, hello: WorkerHello, now: float) -> int | None:
        """A worker joined; returns how many requests a previous process of it had in flight (None: new)."""
        old = self.workers.get(worker_id)
        self.lost.pop(worker_id, None)  # a new process: what a stalled one ran is gone with it
        if old is not None:  # a restarted worker: what its last process ran is gone with it
            self.stats["workers_rejoined"] += 1
            self._drop_inflight(old, FailureReason.REJOINED, now)
        self.workers[worker_id] = WorkerState(hello)
        self.orphaned_since = None
        return None if old is None else old.running

    def on_back(self, worker_id: str, hello: WorkerHello, now: float) -> int:
        """A worker lost for its silence spoke again: it was stalled, not dead, and still runs its batches.
        It rejoins, and each of those batches' requests still queued (requeued at the loss, not launched
        again nor failed since) is in flight on it again under its batch id, so the worker's own end of
        it counts; returns how many were taken back. A request already launched elsewhere keeps that
        launch (the collector keeps the first terminal record and counts the other)."""
        batches = self.lost.pop(worker_id, {})
        self.on_hello(worker_id, hello, now)
        state, taken = self.workers[worker_id], 0
        for batch_id, requests in batches.items():
            back = self.queue.take(requests)
            if back:
                for r in back:
                    self.losses[r.request_id] -= 1  # it was not lost after all
                state.start(batch_id, back)
                taken += len(back)
        return taken

    def knows(self, request_id: int) -> bool:
        """Was a request of this id received already (then another of it is refused, never merged)?"""
        return request_id in self.seen

    def on_request(self, request: RequestMsg, now: float) -> bool:
        """A request arrived; False when it failed at once (queue full, or no worker left) or was refused:
        its id was taken (counted in duplicate_requests; no record, the first of that id keeps its own)."""
        if request.request_id in self.seen:
            self.stats["duplicate_requests"] += 1
            return False
        self.seen.add(request.request_id)
        self.stats["submitted"] += 1
        if self.queue.is_full_for(request.prompt_len + request.output_len, self.max_queue, self.max_queue_tokens):
            self.stats["queue_full"] += 1
            self._fail(request, FailureReason.QUEUE_FULL, now)
            return False
        if self._grace_over(now):
            self._fail(request, FailureReason.NO_WORKER_LEFT, now)
            return False
        self.queue.append(request)
        self.stats["max_queue_len"] = max(self.stats["max_queue_len"], len(self.queue))
        return True

    def on_batch_done(self, worker_id: str, batch_id: int, oom: bool, now: float) -> list[RequestMsg] | None:
        """A batch is over (its worker decided each row's end, unless it ran out of memory); returns its
        requests (None: unknown). After an OOM they go back to the front, in order; one alone fails."""
        state = self.workers.get(worker_id)
        batch = state.end(batch_id) if state else None
        if batch is None:
            return None
        state.batches_done += 1
        self.policy.on_batch_done(len(batch), oom)
        if oom:
            self.stats["oom_batches"] += 1
            if len(batch) == 1:  # it does not fit even alone: retrying cannot help
                self._fail(batch[0], FailureReason.OOM_ALONE, now)
            else:
                self._requeue(batch)  # the policy's cap has halved
        return batch

    def on_capacity(self, worker_id: str, max_rows: int) -> int | None:
        """The worker's row cap moved (OOM back-off or probe); returns the cap now used (None: unknown worker)."""
        state = self.workers.get(worker_id)
        if state is None:
            return None
        self.stats["capacity_changes"] += 1
        return state.set_max_rows(max_rows)

    def on_worker_lost(self, worker_id: str, now: float) -> None:
        """A worker is gone: each request it ran is requeued once (MAX_LOSSES), then failed."""
        state = self.workers.pop(worker_id, None)
        if state is None:
            return
        self.stats["workers_lost"] += 1
        self.lost[worker_id] = dict(state.inflight)
        if not self.workers:
            self.orphaned_since = now
        self._drop_inflight(state, detailed(FailureKind.WORKER_LOST, worker_id), now)

    def on_send_failed(self, unsent: list[Launch], now: float) -> None:
        """These launches (of one worker, in order) never reached it: they go back to the front, not
        counting as a loss, and the worker is lost (with what it did receive)."""
        for launch in unsent:
            self._take_back(launch)
        self._requeue([r for launch in unsent for r in launch.requests])
        self.on_worker_lost(unsent[0].worker_id, now)

    def on_unsendable(self, launch: Launch, reason: str, now: float) -> None:
        """A launch whose Dispatch cannot be sent (over the frame limit): its requests fail with `reason`."""
        self._take_back(launch)
        for r in launch.requests:
            self._fail(r, reason, now)

    def end_of_stream(self) -> None:
        """Traffic sent its last request: policies may flush what is left."""
        self.eos = True

    def tick(self, now: float) -> None:
        """With no worker back within the grace, every queued request fails; so do they when the stream
        ended and the policy launched nothing on idle workers for stall_limit_s (it is stalled)."""
        if self._grace_over(now):
            self.fail_queue(FailureReason.NO_WORKER_LEFT, now)
        if not self._idle_with_queue():
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        elif self.stall_limit_s and now - self.idle_since >= self.stall_limit_s:
            self.stats["stalled"] = len(self.queue)
            stalled = STALLED.format(limit_s=self.stall_limit_s, queued=len(self.queue))
            self.fail_queue(detailed(FailureKind.STALLED, stalled), now)
            self.idle_since = None

    def _idle_with_queue(self) -> bool:
        """The stream ended, requests wait, and every worker (one at least) runs nothing."""
        return (self.eos and bool(self.queue) and bool(self.workers)
                and not any(w.inflight for w in self.workers.values()))

    def fail_queue(self, reason: str, now: float) -> None:
        """Every queued request becomes a terminal failure (a stop, or no worker left)."""
        while self.queue:
            self._fail(self.queue.popleft(), reason, now)

    # --- decisions out ------------------------------------------------------------------------------
    def schedule(self, now: float) -> Decisions:
        """Ask the policy, worker by worker (least loaded first), and start what it launches: at most one
        launch per worker."""
        out = Decisions(wake_at=self._grace_end(now))
        for wid in least_loaded(self.workers) if len(self.workers) > 1 else list(self.workers):
            if not self.queue:
                break
            state = self.workers[wid]
            shown, cap = self._head(state), state.capacity()
            decision = self.policy.decide(shown, now, cap, self.eos)
            batch = self._within_room(self._carry_out(decision, len(shown), now), cap.free_slots)
            if batch:
                out.launches.append(self._launch(wid, batch, decision.reason))
            elif decision.wake_at is not None:
                out.wake_at = decision.wake_at if out.wake_at is None else min(out.wake_at, decision.wake_at)
        return out

    def drain(self) -> list[RequestFailed]:
        """The terminal records decided since the last call, oldest first."""
        out, self.outbox = self.outbox, []
        return out

    def done(self) -> bool:
        """The stream ended and every request is terminal or back with its worker's BatchDone."""
        return self.eos and not self.queue and not any(w.inflight for w in self.workers.values())

    def workers_info(self) -> dict[str, dict]:
        """RunInfo's `workers`: each worker's hello, flattened."""
        return {wid: state.hello.as_run_info() for wid, state in self.workers.items()}

    # --- the rules' parts ---------------------------------------------------------------------------
    def _head(self, state: WorkerState) -> list[RequestMsg]:
        """The part of the queue a decision can use: what the worker could take, or the policy's
        `lookahead` when it ranks more (sjf, edf)."""
        n = max(state.max_rows, getattr(self.policy, "lookahead", 0), 1)
        return list(itertools.islice(self.queue, n))  # deque[i] is O(i)

    def _carry_out(self, decision: Decision, shown: int, now: float) -> list[RequestMsg]:
        """Fail what the decision rejects; take out of the queue, in launch order, what it launches."""
        if not (decision.pick or decision.reject):
            return [self.queue.popleft() for _ in range(min(decision.n, shown))]  # more: past what it was shown
        positions = [*decision.pick, *decision.reject]
        if len(set(positions)) != len(positions) or not all(0 <= i < shown for i in positions):
            raise ValueError(f"policy {self.policy.name}: pick {decision.pick} and reject {decision.reject} "
                             f"must be distinct positions of the {shown} queued requests it was shown")
        taken = self._take(positions)
        for r in taken[len(decision.pick):]:
            self._fail(r, decision.reject_reason or FailureReason.REJECTED, now)
        return taken[:len(decision.pick)]

    def _within_room(self, batch: list[RequestMsg], free_slots: int) -> list[RequestMsg]:
        """The launch cut to the worker's free rows: a strategy that launches more (a wrong one) cannot
        overfill a worker, which would hold the rest unanswered; they go back to the front, in order, and
        the cut is counted (launches_clamped, rows_clamped)."""
        room = max(free_slots, 0)
        if len(batch) <= room:
            return batch
        self.stats["launches_clamped"] += 1
        self.stats["rows_clamped"] += len(batch) - room
        self._requeue(batch[room:])
        return batch[:room]

    def _take(self, positions: list[int]) -> list[RequestMsg]:
        """The requests at these queue positions, in the order given; the rest keep their order."""
        head = [self.queue.popleft() for _ in range(max(positions) + 1)]
        chosen = set(positions)
        self._requeue([r for i, r in enumerate(head) if i not in chosen])
        return [head[i] for i in positions]

    def _launch(self, wid: str, batch: list[RequestMsg], reason: str) -> Launch:
        """One launch: a continuous worker's requests get a batch each (they join and leave alone); a
        static worker's share one."""
        state = self.workers[wid]
        self.idle_since = None  # a launch: the policy is not stalled
        groups = [[r] for r in batch] if state.hello.mode == BatchingMode.CONTINUOUS else [batch]
        rows = []
        for group in groups:
            rows += [RequestRow(self.next_batch_id, r) for r in group]
            state.start(self.next_batch_id, group)
            self.next_batch_id += 1
        return Launch(wid, reason, rows, len(self.queue))

    def _take_back(self, launch: Launch) -> None:
        """Its batches do not run on its worker (it never got them)."""
        state = self.workers.get(launch.worker_id)
        for batch_id in launch.batch_ids() if state is not None else ():
            state.end(batch_id)

    def _drop_inflight(self, state: WorkerState, reason: str, now: float) -> None:
        """A worker's in-flight requests went with it: each is requeued once, then failed with `reason`."""
        lost = [r for batch in state.inflight.values() for r in batch]
        for r in lost:
            self.losses[r.request_id] = self.losses.get(r.request_id, 0) + 1
        # the ones left are requeued: to a live worker, or one that rejoins
        self._requeue([r for r in lost if self.losses[r.request_id] <= MAX_LOSSES])
        for r in lost:
            if self.losses[r.request_id] > MAX_LOSSES:
                self._fail(r, reason, now)

    def _requeue(self, requests: list[RequestMsg]) -> None:
        """Back to the front of the queue, in their order."""
        for r in reversed(requests):
            self.queue.appendleft(r)

    def _fail(self, request: RequestMsg, reason: str, now: float) -> None:
        self.outbox.append(RequestFailed(request.request_id, reason, now))

    def _grace_end(self, now: float) -> float | None:
        """When queued requests stop waiting for a worker (None: one is there, nothing waits, or it passed)."""
        if self.orphaned_since is None or not self.queue:
            return None
        end = self.orphaned_since + WORKER_REJOIN_GRACE_S
        return end if end > now else None

    def _grace_over(self, now: float) -> bool:
        return self.orphaned_since is not None and now >= self.orphaned_since + WORKER_REJOIN_GRACE_S
