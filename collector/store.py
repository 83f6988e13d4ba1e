"""RunStore: joins the collector's events by request id. Pure: no sockets, no clock, no pandas in
the hot path (plain dicts and lists; DataFrames are built only in take_parts and finish)."""
from dataclasses import dataclass, field

import pandas as pd

from batchlab.collector import tables
from batchlab.collector.parts import load_table
from batchlab.collector.tables import Tables
from batchlab.protocol.messages import STEP_BATCH
from batchlab.protocol import (
    Arrival, BatchDone, BatchLaunch, RequestFailed, RunEnd, RunInfo, Step, Tokens, WorkerBye,
)

__all__ = ["RequestState", "RunStore", "Tables", "load_table"]


@dataclass(slots=True)
class RequestState:
    """What is known about one request so far."""

    request_id: int
    arrival: Arrival | None = None
    batches: list[int] = field(default_factory=list)  # batch ids it was launched in, in order
    status: str = ""  # "" until terminal, then "finished" | "failed"
    error: str = ""
    terminal_batch: int | None = None  # the batch whose BatchDone made it terminal


class RunStore:
    """Every event of one run, joined by request id and batch id."""

    def __init__(self) -> None:
        self.settings: dict = {}
        self.requests: dict[int, RequestState] = {}
        # (request_id, batch_id) -> [(time, token_id), ...] in arrival order of tokens
        self.tokens: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self.batch_requests: dict[int, set[int]] = {}  # batch_id -> request ids seen in its tokens
        self.launches: dict[int, BatchLaunch] = {}
        self.dones: dict[int, BatchDone] = {}
        self.steps: list[Step] = []
        self.run_end: RunEnd | None = None
        self.byes: dict[str, WorkerBye] = {}
        self.engine_metrics: dict[int, dict] = {}  # request_id -> an engine's own stamps (BatchDone)
        self.counters = {"rejected_messages": 0, "ignored_tokens": 0, "duplicate_terminals": 0}
        self._new_terminal: list[int] = []  # terminal since the last take_parts
        self._pending_batches: list[int] = []  # done, not yet in a part
        self._steps_flushed = 0
        # continuous step tokens that overtook their request's BatchLaunch (the scheduler's and the
        # worker's sockets are separate pipes): request_id -> [(time, token_id)], joined at the launch
        self._early_tokens: dict[int, list[tuple[float, int]]] = {}
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

    def reject(self) -> None:
        """Count a frame that could not be decoded or used."""
        self.counters["rejected_messages"] += 1

    def _request(self, request_id: int) -> RequestState:
        state = self.requests.get(request_id)
        if state is None:
            state = self.requests[request_id] = RequestState(request_id)
        return state

    def _on_run_info(self, msg: RunInfo) -> None:
        self.settings = dict(msg.settings)

    def _on_arrival(self, msg: Arrival) -> None:
        self._request(msg.request_id).arrival = msg

    def _on_launch(self, msg: BatchLaunch) -> None:
        self.launches[msg.batch_id] = msg
        for rid in msg.request_ids:
            self._request(rid).batches.append(msg.batch_id)
        if self._early_tokens:
            self._join_early_tokens(msg)

    def _join_early_tokens(self, msg: BatchLaunch) -> None:
        """Step tokens that came before this launch belong to it (they are no longer ignored)."""
        for rid in msg.request_ids:
            early = self._early_tokens.pop(rid, None)
            if early is None:
                continue
            self.counters["ignored_tokens"] -= len(early)
            self.tokens.setdefault((rid, msg.batch_id), []).extend(early)  # they came first
            self.batch_requests.setdefault(msg.batch_id, set()).add(rid)

    def _on_tokens(self, msg: Tokens) -> None:
        bid, t, tokens = msg.batch_id, msg.time, self.tokens
        done = self.dones.get(bid)
        if len(msg.request_ids) != len(msg.token_ids):  # decodes, but cannot be joined: a bad frame
            self.reject()
            return
        if done is not None and done.oom:  # a late token of an attempt that never counts
            self.counters["ignored_tokens"] += len(msg.token_ids)
            return
        if bid == STEP_BATCH:
            self._on_step_tokens(msg)
            return
        seen = self.batch_requests.setdefault(bid, set())
        for rid, tok in zip(msg.request_ids, msg.token_ids):
            rows = tokens.get((rid, bid))
            if rows is None:
                rows = tokens[(rid, bid)] = []
                seen.add(rid)
            rows.append((t, tok))

    def _on_step_tokens(self, msg: Tokens) -> None:
        """A continuous step: each token belongs to its request's latest launched batch."""
        for rid, tok in zip(msg.request_ids, msg.token_ids):
            state = self.requests.get(rid)
            if state is None or not state.batches:  # ignored unless its launch comes later
                self.counters["ignored_tokens"] += 1
                self._early_tokens.setdefault(rid, []).append((msg.time, tok))
                continue
            bid = state.batches[-1]
            rows = self.tokens.get((rid, bid))
            if rows is None:
                rows = self.tokens[(rid, bid)] = []
                self.batch_requests.setdefault(bid, set()).add(rid)
            rows.append((msg.time, tok))

    def _on_batch_done(self, msg: BatchDone) -> None:
        self.dones[msg.batch_id] = msg
        self._pending_batches.append(msg.batch_id)
        if msg.oom:  # the scheduler requeues every row: this attempt never counts
            self._discard_tokens(msg.batch_id)
            return
        for rid, m in msg.engine_metrics.items():
            if isinstance(m, dict) and str(rid).lstrip("-").isdigit():
                self.engine_metrics[int(rid)] = m
        for rid in msg.finished:
            self._terminate(rid, "finished", "", msg.batch_id)
        for row in msg.failed:
            if row and type(row[0]) is int:
                self._terminate(row[0], "failed", str(row[1]) if len(row) > 1 else "failed", msg.batch_id)

    def _discard_tokens(self, batch_id: int) -> None:
        launch = self.launches.get(batch_id)
        rids = self.batch_requests.pop(batch_id, set()) | set(launch.request_ids if launch else ())
        for rid in rids:
            self.tokens.pop((rid, batch_id), None)

    def _on_request_failed(self, msg: RequestFailed) -> None:
        self._terminate(msg.request_id, "failed", msg.reason, None)

    def _terminate(self, rid: int, status: str, error: str, batch_id: int | None) -> None:
        state = self._request(rid)
        if state.status:  # exactly one terminal record per request: the first one wins
            self.counters["duplicate_terminals"] += 1
            return
        state.status, state.error, state.terminal_batch = status, error, batch_id
        self._new_terminal.append(rid)

    def _on_run_end(self, msg: RunEnd) -> None:
        self.run_end = msg

    def _on_bye(self, msg: WorkerBye) -> None:
        self.byes[msg.worker_id] = msg

    # --- state queries -------------------------------------------------------------------------
    def all_byes_in(self) -> bool:
        """RunEnd arrived and every worker it names has said bye."""
        return self.run_end is not None and all(w in self.byes for w in self.run_end.workers)

    def t0(self) -> float:
        """Scheduler-clock time of planned offset 0 (fallback: the first planned arrival, else 0)."""
        if "t0" in self.settings:
            return float(self.settings["t0"])
        times = [s.arrival.arrival_time for s in self.requests.values() if s.arrival is not None]
        return min(times, default=0.0)

    def counting_batch(self, state: RequestState) -> int:
        """The attempt that counts: the batch that made it terminal, else its last non-OOM batch."""
        if state.terminal_batch is not None:
            return state.terminal_batch
        for bid in reversed(state.batches):
            done = self.dones.get(bid)
            if done is None or not done.oom:
                return bid
        return -1

    # --- output --------------------------------------------------------------------------------
    def take_parts(self, *, final: bool = False) -> dict[str, pd.DataFrame]:
        """Rows new since the last call, per table (waits for RunInfo's t0 unless `final`)."""
        if "t0" not in self.settings and not final:
            return {}
        t0 = self.t0()
        rids = [r for r in self._new_terminal if self.requests[r].arrival is not None]
        self._new_terminal = [r for r in self._new_terminal if self.requests[r].arrival is None]
        bids = [b for b in self._pending_batches if b in self.launches or final]
        taken = set(bids)  # a set: continuous runs have one batch per request (a list made this O(n²))
        self._pending_batches = [b for b in self._pending_batches if b not in taken]
        steps, self._steps_flushed = self.steps[self._steps_flushed:], len(self.steps)
        parts = {"requests": tables.requests_frame(self, rids, t0),
                 "tokens": tables.tokens_frame(self, rids, t0),
                 "batches": tables.batches_frame(self, bids, t0),
                 "steps": tables.steps_frame(steps, t0)}
        return {name: df for name, df in parts.items() if not df.empty}

    def finish(self, schedule: pd.DataFrame | None = None, *, slos: dict | None = None) -> Tables:
        """The final tables: unfinished requests failed, unsent schedule rows added, summary built."""
        return tables.build_tables(self, schedule, slos)
