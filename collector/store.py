"""RunStore: joins the collector's events by request id. Pure: no sockets, no clock, no pandas in
the hot path (plain dicts and typed arrays; DataFrames are built only in take_parts and finish).

Memory follows what is in flight, not how long the run is. PartTaking is the RunStore's way out: rows
new since the last take go to part files, and what was written leaves memory; the store tells it of
each change, and it owns only when rows are written. A request's tokens are kept (two typed arrays,
16 bytes a token) until its rows are taken; its request row is written then too, once it is terminal.
It stays in memory KEEP_TAKES more takes (a late token, arrival or launch writes its row again; the
merge keeps a request's last row), then leaves: only its id stays, as a bit in `ended`, so that a late
event of a request that left is recognised and counted. A batch's launch and completion leave with the
last request in memory that refers to them, once the batch's row is written. The final tables are
merged from the part files (collector.merge).
"""
import math
from collections import deque

import pandas as pd

from batchlab.collector import tables
from batchlab.collector.parts import SETTINGS_COLUMNS, Tables
from batchlab.collector.request import EndedIds, HeldTokens, RequestState, TokenBuffer
from batchlab.collector.store_view import StoreView
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RequestFailed, RunEnd, RunInfo, Step, Tokens, WorkerBye
from batchlab.protocol.status import RequestStatus

SCALARS = (type(None), bool, int, float, str)  # what a settings column of the tables may hold
KEEP_TAKES = 10  # takes a written request stays for late events (the collector takes once a second)


class RunStore:
    """Every event of one run, joined by request id and batch id (self.taking: their way out)."""

    def __init__(self) -> None:
        self.settings: dict = {}
        self.requests: dict[int, RequestState] = {}  # in flight, or written less than KEEP_TAKES takes ago
        self.ended = EndedIds()  # requests that left memory
        # (request_id, batch_id) -> its tokens in arrival order, until the request's rows are taken
        self.tokens: dict[tuple[int, int], HeldTokens] = {}
        self.batch_requests: dict[int, set[int]] = {}  # batch_id -> request ids seen in its tokens
        self.launches: dict[int, BatchLaunch] = {}
        self.dones: dict[int, BatchDone] = {}
        self.batch_refs: dict[int, int] = {}  # batch_id -> requests in memory launched in it
        self.steps: list[Step] = []  # not yet taken
        self.steps_taken = 0
        self.run_end: RunEnd | None = None
        self.byes: dict[str, WorkerBye] = {}
        self.engine_metrics: dict[int, dict] = {}  # request_id -> an engine's own stamps (BatchDone)
        self.engine_keys: set[str] = set()  # every key seen in engine_metrics
        self.counters = {"rejected_messages": 0, "ignored_tokens": 0, "duplicate_terminals": 0}
        self.arrivals = 0  # requests whose Arrival came
        self.progress = {"launched": 0, "finished": 0, "failed": 0, "failed_unlaunched": 0}  # requests
        self.peak_memory_bytes = 0  # the largest a BatchDone reported
        self._first_arrival = math.inf  # scheduler clock
        self.taking = PartTaking()
        self._handlers = {
            RunInfo: self._on_run_info, Arrival: self._on_arrival, BatchLaunch: self._on_launch,
            Tokens: self._on_tokens, Step: self.steps.append, BatchDone: self._on_batch_done,
            RequestFailed: self._on_request_failed, RunEnd: self._on_run_end, WorkerBye: self._on_bye,
        }

    # --- events --------------------------------------------------------------------------------
    def handle(self, msg: object) -> None:
        """Record one decoded message (unknown kinds, e.g. Heartbeat, are ignored)."""
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(msg)

    def _request(self, request_id: int) -> RequestState | None:
        """Its state, new if unseen; None for a request that ended and left memory."""
        state = self.requests.get(request_id)
        if state is None and request_id not in self.ended:
            state = self.requests[request_id] = RequestState(request_id)
        return state

    def _on_run_info(self, msg: RunInfo) -> None:
        if not msg.is_valid():  # the codec refuses it too; a store fed in-process checks again
            raise ValueError(f"RunInfo: t0 {msg.settings.get('t0')!r} is not a finite number")
        wrong = [k for k in SETTINGS_COLUMNS if not isinstance(msg.settings.get(k), SCALARS)]
        if wrong:  # each is a column of every table row
            raise ValueError(f"RunInfo: setting {wrong[0]} {msg.settings[wrong[0]]!r:.40} is not a single value")
        self.settings = dict(msg.settings)

    def _on_arrival(self, msg: Arrival) -> None:
        rid = msg.request.request_id
        state = self._request(rid)
        if state is None:
            return
        if state.arrival is not None:  # a request's id arrives once: a second one is refused, never merged
            raise ValueError(f"Arrival: request {rid} arrived already")
        self.arrivals += 1
        self._first_arrival = min(self._first_arrival, msg.request.arrival_time)
        state.arrival = msg
        if state.taken_batch is not None:  # its written row changes
            self.taking.changed(rid)

    def _on_launch(self, msg: BatchLaunch) -> None:
        if not msg.is_valid():  # the codec refuses it too; a store fed in-process checks again
            raise ValueError("BatchLaunch: request_ids and batch_ids differ in length")
        for rid, bid in zip(msg.request_ids, msg.batch_ids):
            self.launches[bid] = msg
            state = self._request(rid)
            if state is None:
                continue
            self.progress["launched"] += not state.batches
            state.batches.append(bid)
            self.batch_refs[bid] = self.batch_refs.get(bid, 0) + 1
            if state.taken_batch is not None:  # its written row changes (attempts)
                self.taking.changed(rid)

    def _on_tokens(self, msg: Tokens) -> None:
        """Each token under (its request, the batch its worker stated); one may come before its launch
        (the scheduler's and the worker's sockets are separate pipes): it is kept, its batch known."""
        if not msg.is_valid():  # decodes, but cannot be joined: a bad frame
            self.counters["rejected_messages"] += 1
            return
        t, tokens, dones = msg.time, self.tokens, self.dones
        for rid, bid, tok in zip(msg.request_ids, msg.batch_ids, msg.token_ids):
            rows = tokens.get((rid, bid))
            if rows is None:
                done = dones.get(bid)
                if done is not None and done.oom:  # a late token of an attempt that never counts
                    self.counters["ignored_tokens"] += 1
                    continue
                rows = self._buffer(rid, bid)
                if rows is None:
                    continue
            rows.append(t, tok)

    def _buffer(self, rid: int, bid: int) -> TokenBuffer | None:
        """A new token buffer for (rid, bid); None for an attempt of a taken request that never counts,
        or a request that left memory (its token is counted as ignored); only called when there is none yet."""
        state = self.requests.get(rid)
        if state is None and rid in self.ended:
            self.counters["ignored_tokens"] += 1
            return None
        if state is not None and state.taken_batch is not None:
            if bid != state.taken_batch:
                return None
            self.taking.changed(rid)  # its rows are in a part already: these go to the next one
        buf = self.tokens[(rid, bid)] = TokenBuffer()
        self.batch_requests.setdefault(bid, set()).add(rid)
        return buf

    def _on_batch_done(self, msg: BatchDone) -> None:
        self.dones[msg.batch_id] = msg
        self.peak_memory_bytes = max(self.peak_memory_bytes, msg.peak_memory_bytes)
        self.taking.batch_done(msg.batch_id)
        if msg.oom:  # the scheduler requeues every row: this attempt never counts
            self._discard_tokens(msg.batch_id)
            return
        self.batch_requests.pop(msg.batch_id, None)  # only an OOM attempt's tokens are looked up by batch
        for rid, m in msg.engine_metrics.items():
            if isinstance(m, dict) and str(rid).lstrip("-").isdigit() and int(rid) not in self.ended:
                self.engine_metrics[int(rid)] = m
                self.engine_keys.update(m)
        for rid in msg.finished:
            self._terminate(rid, RequestStatus.FINISHED, "", msg.batch_id)
        for row in msg.failed:
            self._terminate(row.request_id, RequestStatus.FAILED, row.reason, msg.batch_id)

    def _discard_tokens(self, batch_id: int) -> None:
        launch = self.launches.get(batch_id)
        rids = self.batch_requests.pop(batch_id, set()) | set(launch.requests_in(batch_id) if launch else ())
        for rid in rids:
            self.tokens.pop((rid, batch_id), None)

    def _on_request_failed(self, msg: RequestFailed) -> None:
        self._terminate(msg.request_id, RequestStatus.FAILED, msg.reason, None)

    def _terminate(self, rid: int, status: RequestStatus, error: str, batch_id: int | None) -> None:
        state = self._request(rid)
        if state is None or state.status:  # exactly one terminal record per request: the first one wins
            self.counters["duplicate_terminals"] += 1
            return
        state.status, state.error, state.terminal_batch = status, error, batch_id
        self.taking.terminal(rid)
        self.progress[status] += 1
        self.progress["failed_unlaunched"] += status == RequestStatus.FAILED and not state.batches

    def _on_run_end(self, msg: RunEnd) -> None:
        self.run_end = msg

    def _on_bye(self, msg: WorkerBye) -> None:
        self.byes[msg.worker_id] = msg

    # --- output and state queries --------------------------------------------------------------
    def take_parts(self, *, final: bool = False) -> dict[str, pd.DataFrame]:
        """Rows new since the last call, per table (PartTaking.take)."""
        return self.taking.take(self, final)

    def counts(self) -> dict[str, int]:
        """Requests so far: arrived, queued (arrived, never launched, not failed), in flight (launched,
        not terminal), finished, failed."""
        p = self.progress
        return {"arrived": self.arrivals, "queued": max(self.arrivals - p["launched"] - p["failed_unlaunched"], 0),
                "in_flight": max(p["launched"] - p["finished"] - (p["failed"] - p["failed_unlaunched"]), 0),
                "finished": p["finished"], "failed": p["failed"]}

    def all_byes_in(self) -> bool:
        """RunEnd arrived and every worker it names has said bye."""
        return self.run_end is not None and all(w in self.byes for w in self.run_end.workers)

    def t0(self) -> float:
        """Scheduler-clock time of planned offset 0 (fallback: the first planned arrival, else 0)."""
        if "t0" in self.settings:
            return float(self.settings["t0"])
        return 0.0 if math.isinf(self._first_arrival) else self._first_arrival

    def view(self) -> StoreView:
        """Its state as the tables read it, now."""
        return StoreView(self.settings, self.t0(), self.requests, self.tokens, self.launches, self.dones, self.steps,
                         self.run_end, self.byes, self.engine_metrics, self.engine_keys, self.counters, self.arrivals,
                         self.peak_memory_bytes)

    def hold(self, request_id: int, batch_id: int, tokens: HeldTokens) -> None:
        """Hold an attempt's tokens given whole (the simulator's views over its step times), as if streamed."""
        self.tokens[(request_id, batch_id)] = tokens
        self.batch_requests.setdefault(batch_id, set()).add(request_id)

    def finish(self, schedule: pd.DataFrame | None = None, *, slos: dict | None = None) -> Tables:
        """The final tables built from memory: unfinished requests failed, unsent schedule rows added,
        summary built. Only for a store whose rows were never taken (the simulator, tests); the
        collector merges its part files instead (collector.merge.merge_run)."""
        return tables.build_tables(self.view(), schedule, slos)


class PartTaking:
    """Which of a RunStore's rows go to the next part file, and what then leaves the store's memory."""

    def __init__(self) -> None:
        self.takes = 0  # take() calls so far
        self._retained: deque[tuple[int, list[int]]] = deque()  # (take, request ids it wrote)
        self._taken_batches: set[int] = set()  # in a part, still referred to by a request in memory
        self._new_terminal: list[int] = []  # terminal since the last take
        self._pending_batches: list[int] = []  # done, not yet in a part
        self._late: set[int] = set()  # written requests whose row changed since (a late token, a relaunch)

    def terminal(self, rid: int) -> None:
        """Request `rid` became terminal: its row is written once complete."""
        self._new_terminal.append(rid)

    def batch_done(self, bid: int) -> None:
        """Batch `bid` is done: its row is written once its launch is in."""
        self._pending_batches.append(bid)

    def changed(self, rid: int) -> None:
        """A written request's row changed (a late token, arrival or launch): it is written again."""
        self._late.add(rid)

    def take(self, store: RunStore, final: bool) -> dict[str, pd.DataFrame]:
        """The store's rows new since the last take, per table (waits for RunInfo's t0 unless `final`, which
        takes every row still in memory); what was written long enough ago leaves the store."""
        if "t0" not in store.settings and not final:
            return {}
        view, self.takes = store.view(), self.takes + 1
        t0 = view.t0
        rids = self._ready_requests(store, final)
        written = rids + sorted(r for r in self._late.difference(rids) if r in store.requests)
        self._late = set()
        bids = self._ready_batches(store, final)
        steps = store.steps[:]
        del store.steps[:]
        store.steps_taken += len(steps)
        engine = {r: store.engine_metrics[r] for r in written if r in store.engine_metrics}
        parts = {"requests": tables.engine_columns(tables.requests_frame(view, written, t0), engine, t0),
                 "tokens": tables.tokens_frame(view, written, t0),
                 "batches": tables.batches_frame(view, bids, t0),
                 "steps": tables.steps_frame(steps, t0)}
        for rid in written:
            self._fold_tokens(store, view, store.requests[rid])
        self._retained.append((self.takes, written))
        self._forget(store, bids)
        return {name: df for name, df in parts.items() if not df.empty}

    def _ready_requests(self, store: RunStore, final: bool) -> list[int]:
        """Terminal requests whose row is complete (arrival in, terminal batch launched); `final`:
        every request not written yet."""
        if final:
            self._new_terminal = []
            return sorted(r for r, s in store.requests.items() if s.taken_batch is None)
        ready, waiting = [], []
        for rid in self._new_terminal:
            state = store.requests[rid]
            settled = state.arrival is not None and (state.terminal_batch is None
                                                     or state.terminal_batch in store.launches)
            (ready if settled else waiting).append(rid)
        self._new_terminal = waiting
        return ready

    def _ready_batches(self, store: RunStore, final: bool) -> list[int]:
        """Done batches whose launch is in; `final`: every batch not written yet."""
        if final:
            self._pending_batches = []
            return sorted((set(store.launches) | set(store.dones)) - self._taken_batches)
        bids = list(dict.fromkeys(b for b in self._pending_batches if b in store.launches))
        taken = set(bids)  # a set: continuous runs have one batch per request (a list made this O(n²))
        self._pending_batches = [b for b in self._pending_batches if b not in taken]
        return bids

    def _fold_tokens(self, store: RunStore, view: StoreView, state: RequestState) -> None:
        """Keep the counting attempt's count and first/last time; drop every held token of the request."""
        bid = view.counting_batch(state)
        state.taken, state.taken_batch, state.taken_at = view.token_stats(state, bid), bid, self.takes
        for b in {bid, *state.batches}:
            store.tokens.pop((state.request_id, b), None)

    def _forget(self, store: RunStore, bids: list[int]) -> None:
        """Batches just written leave memory unless a request in memory refers to them; terminal
        requests written KEEP_TAKES takes ago (and not since) leave it."""
        for bid in bids:
            if store.batch_refs.get(bid, 0):
                self._taken_batches.add(bid)
            else:
                self._forget_batch(store, bid)
        while self._retained and self._retained[0][0] <= self.takes - KEEP_TAKES:
            take, rids = self._retained.popleft()
            for rid in rids:
                state = store.requests.get(rid)
                if state is not None and state.status and state.taken_at == take:
                    self._forget_request(store, state)

    def _forget_request(self, store: RunStore, state: RequestState) -> None:
        rid = state.request_id
        del store.requests[rid]
        store.ended.add(rid)
        store.engine_metrics.pop(rid, None)
        for bid in state.batches:
            store.tokens.pop((rid, bid), None)
            refs = store.batch_refs.pop(bid, 0) - 1
            if refs > 0:
                store.batch_refs[bid] = refs
            elif bid in self._taken_batches:
                self._forget_batch(store, bid)

    def _forget_batch(self, store: RunStore, bid: int) -> None:
        store.launches.pop(bid, None)
        store.dones.pop(bid, None)
        store.batch_requests.pop(bid, None)
        self._taken_batches.discard(bid)
