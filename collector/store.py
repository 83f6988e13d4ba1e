"""RunStore: joins the collector's events by request id. Pure: no sockets, no clock, no pandas in
the hot path (plain dicts and typed arrays; DataFrames are built only in take_parts and finish).

Memory follows what is in flight, not how long the run is: a request's tokens are kept (two typed
arrays, 16 bytes a token) until its rows go to a part file (take_parts); from then on the request
keeps three numbers (count, first and last token time), and taken steps are dropped. The final
tokens and steps tables are then merged from the part files (collector.parts.merge_tokens).
"""
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchlab.collector import tables
from batchlab.collector.parts import load_table
from batchlab.collector.tables import Tables
from batchlab.protocol.messages import STEP_BATCH
from batchlab.protocol import Arrival, BatchDone, BatchLaunch, RequestFailed, RunEnd, RunInfo, Step, Tokens, WorkerBye

__all__ = ["RequestState", "RunStore", "Tables", "TokenBuffer", "load_table"]

NAN = float("nan")


class TokenBuffer(Sequence):
    """One attempt's tokens in arrival order, as [(time, token_id), ...] over two typed arrays."""

    __slots__ = ("times", "ids")

    def __init__(self) -> None:
        self.times = array("d")  # scheduler-clock s
        self.ids = array("q")

    def append(self, time: float, token_id: int) -> None:
        self.times.append(time)
        self.ids.append(token_id)

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(zip(self.times[index], self.ids[index]))
        return self.times[index], self.ids[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (Sequence)) or isinstance(other, (str, bytes)):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # mutable


@dataclass(slots=True)
class RequestState:
    """What is known about one request so far."""

    request_id: int
    arrival: Arrival | None = None
    batches: list[int] = field(default_factory=list)  # batch ids it was launched in, in order
    status: str = ""  # "" until terminal, then "finished" | "failed"
    error: str = ""
    terminal_batch: int | None = None  # the batch whose BatchDone made it terminal
    # once its token rows went to a part: the counting batch and its tokens' count, first and last
    # time (scheduler clock); the rows themselves are no longer in memory
    taken_batch: int | None = None
    taken: tuple[int, float, float] = (0, NAN, NAN)


class RunStore:
    """Every event of one run, joined by request id and batch id."""

    def __init__(self) -> None:
        self.settings: dict = {}
        self.requests: dict[int, RequestState] = {}
        # (request_id, batch_id) -> its tokens in arrival order, until the request's rows are taken
        self.tokens: dict[tuple[int, int], Sequence] = {}
        self.batch_requests: dict[int, set[int]] = {}  # batch_id -> request ids seen in its tokens
        self.launches: dict[int, BatchLaunch] = {}
        self.dones: dict[int, BatchDone] = {}
        self.steps: list[Step] = []  # not yet taken
        self.steps_taken = 0
        self.run_end: RunEnd | None = None
        self.byes: dict[str, WorkerBye] = {}
        self.engine_metrics: dict[int, dict] = {}  # request_id -> an engine's own stamps (BatchDone)
        self.counters = {"rejected_messages": 0, "ignored_tokens": 0, "duplicate_terminals": 0}
        self._new_terminal: list[int] = []  # terminal since the last take_parts
        self._pending_batches: list[int] = []  # done, not yet in a part
        self._late: set[int] = set()  # taken requests whose counting attempt got tokens after
        # continuous step tokens that overtook their request's BatchLaunch (the scheduler's and the
        # worker's sockets are separate pipes): request_id -> [(time, token_id)], joined at the launch
        self._early_tokens: dict[int, list[tuple[float, int]]] = {}
        self._handlers = {
            RunInfo: self._on_run_info, Arrival: self._on_arrival, BatchLaunch: self._on_launch,
            Tokens: self._on_tokens, Step: self._on_step, BatchDone: self._on_batch_done,
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
            buf = None if early is None else self._buffer(rid, msg.batch_id)
            if buf is None:
                continue
            self.counters["ignored_tokens"] -= len(early)
            for t, tok in early:  # they came first
                buf.append(t, tok)
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
        for rid, tok in zip(msg.request_ids, msg.token_ids):
            rows = tokens.get((rid, bid))
            if rows is None:
                rows = self._buffer(rid, bid)
                if rows is None:
                    continue
            rows.append(t, tok)

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
                rows = self._buffer(rid, bid)
                if rows is None:
                    continue
            rows.append(msg.time, tok)

    def _buffer(self, rid: int, bid: int) -> TokenBuffer | None:
        """A new token buffer for (rid, bid); None for an attempt of a taken request that never counts."""
        buf = self.tokens.get((rid, bid))
        if buf is not None:
            return buf
        state = self.requests.get(rid)
        if state is not None and state.taken_batch is not None:
            if bid != state.taken_batch:
                return None
            self._late.add(rid)  # its rows are in a part already: these go to the next one
        buf = self.tokens[(rid, bid)] = TokenBuffer()
        self.batch_requests.setdefault(bid, set()).add(rid)
        return buf

    def _on_batch_done(self, msg: BatchDone) -> None:
        self.dones[msg.batch_id] = msg
        self._pending_batches.append(msg.batch_id)
        if msg.oom:  # the scheduler requeues every row: this attempt never counts
            self._discard_tokens(msg.batch_id)
            return
        self.batch_requests.pop(msg.batch_id, None)  # only an OOM attempt's tokens are looked up by batch
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

    def _on_step(self, msg: Step) -> None:
        self.steps.append(msg)

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

    def token_stats(self, state: RequestState, bid: int) -> tuple[int, float, float]:
        """Attempt `bid` of a request: its tokens' count, first and last time (scheduler clock)."""
        n, first, last = state.taken if bid == state.taken_batch else (0, NAN, NAN)
        buf = self.tokens.get((state.request_id, bid))
        if buf:
            times = buf.times
            first = first if n else float(times[0])
            n, last = n + len(times), float(times[-1])
        return n, first, last

    def token_offset(self, state: RequestState, bid: int) -> int:
        """The index of attempt `bid`'s first held token (tokens already taken come before it)."""
        return state.taken[0] if bid == state.taken_batch else 0

    def finished_ids(self) -> list[int]:
        """Request ids that finished, ascending."""
        return sorted(rid for rid, s in self.requests.items() if s.status == "finished")

    def held_ids(self) -> list[int]:
        """Requests whose counting attempt still has tokens in memory (not yet in a part), ascending."""
        return sorted({rid for rid, _ in self.tokens} & set(self.requests))

    def held_tokens(self) -> pd.DataFrame:
        """The tokens rows of requests not yet taken (times since t0)."""
        return tables.tokens_frame(self, self.held_ids(), self.t0())

    # --- output --------------------------------------------------------------------------------
    def take_parts(self, *, final: bool = False) -> dict[str, pd.DataFrame]:
        """Rows new since the last call, per table (waits for RunInfo's t0 unless `final`); the taken
        requests' tokens and the taken steps leave memory."""
        if "t0" not in self.settings and not final:
            return {}
        t0 = self.t0()
        rids = [r for r in self._new_terminal if self.requests[r].arrival is not None]
        self._new_terminal = [r for r in self._new_terminal if self.requests[r].arrival is None]
        late, self._late = sorted(self._late.difference(rids)), set()
        bids = [b for b in self._pending_batches if b in self.launches or final]
        taken = set(bids)  # a set: continuous runs have one batch per request (a list made this O(n²))
        self._pending_batches = [b for b in self._pending_batches if b not in taken]
        steps = self.steps[:]
        del self.steps[:]
        self.steps_taken += len(steps)
        parts = {"requests": tables.requests_frame(self, rids, t0),
                 "tokens": tables.tokens_frame(self, rids + late, t0),
                 "batches": tables.batches_frame(self, bids, t0),
                 "steps": tables.steps_frame(steps, t0)}
        for rid in rids + late:
            self._fold_tokens(self.requests[rid])
        return {name: df for name, df in parts.items() if not df.empty}

    def _fold_tokens(self, state: RequestState) -> None:
        """Keep the counting attempt's count and first/last time; drop every held token of the request."""
        bid = self.counting_batch(state)
        state.taken, state.taken_batch = self.token_stats(state, bid), bid
        for b in {bid, *state.batches}:
            self.tokens.pop((state.request_id, b), None)

    def finish(self, schedule: pd.DataFrame | None = None, *, slos: dict | None = None,
               itl: np.ndarray | None = None) -> Tables:
        """The final tables: unfinished requests failed, unsent schedule rows added, summary built.
        With `itl` (the inter-token gaps of finished requests, merged from the part files) the tokens
        and steps tables are left to the caller (None here); else they are built from memory."""
        return tables.build_tables(self, schedule, slos, itl=itl)
