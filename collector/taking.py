"""PartTaking, the RunStore's way out: rows new since the last take go to part files, and what was
written leaves memory, so the store follows what is in flight, not how long the run is.

A request's tokens are kept (two typed arrays, 16 bytes a token) until its rows are taken; its request
row is written then too, once it is terminal. It stays in memory KEEP_TAKES more takes (a late token,
arrival or launch writes its row again; the merge keeps a request's last row), then leaves: only its
id stays, as a bit in `ended`. A batch's launch and completion leave with the last request in memory
that refers to them, once the batch's row is written. The final tables are merged from the part files
(collector.merge). The store tells PartTaking of each change; PartTaking owns only when rows are written.
"""
from collections import deque
from typing import TYPE_CHECKING

import pandas as pd

from batchlab.collector import tables
from batchlab.collector.request import RequestState

if TYPE_CHECKING:
    from batchlab.collector.store import RunStore

KEEP_TAKES = 10  # takes a written request stays for late events (the collector takes once a second)


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

    def take(self, store: "RunStore", final: bool) -> dict[str, pd.DataFrame]:
        """The store's rows new since the last take, per table (waits for RunInfo's t0 unless `final`, which
        takes every row still in memory); what was written long enough ago leaves the store."""
        if "t0" not in store.settings and not final:
            return {}
        t0, self.takes = store.t0(), self.takes + 1
        rids = self._ready_requests(store, final)
        written = rids + sorted(r for r in self._late.difference(rids) if r in store.requests)
        self._late = set()
        bids = self._ready_batches(store, final)
        steps = store.steps[:]
        del store.steps[:]
        store.steps_taken += len(steps)
        engine = {r: store.engine_metrics[r] for r in written if r in store.engine_metrics}
        parts = {"requests": tables.engine_columns(tables.requests_frame(store, written, t0), engine, t0),
                 "tokens": tables.tokens_frame(store, written, t0),
                 "batches": tables.batches_frame(store, bids, t0),
                 "steps": tables.steps_frame(steps, t0)}
        for rid in written:
            self._fold_tokens(store, store.requests[rid])
        self._retained.append((self.takes, written))
        self._forget(store, bids)
        return {name: df for name, df in parts.items() if not df.empty}

    def _ready_requests(self, store: "RunStore", final: bool) -> list[int]:
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

    def _ready_batches(self, store: "RunStore", final: bool) -> list[int]:
        """Done batches whose launch is in; `final`: every batch not written yet."""
        if final:
            self._pending_batches = []
            return sorted((set(store.launches) | set(store.dones)) - self._taken_batches)
        bids = list(dict.fromkeys(b for b in self._pending_batches if b in store.launches))
        taken = set(bids)  # a set: continuous runs have one batch per request (a list made this O(n²))
        self._pending_batches = [b for b in self._pending_batches if b not in taken]
        return bids

    def _fold_tokens(self, store: "RunStore", state: RequestState) -> None:
        """Keep the counting attempt's count and first/last time; drop every held token of the request."""
        bid = store.counting_batch(state)
        state.taken, state.taken_batch, state.taken_at = store.token_stats(state, bid), bid, self.takes
        for b in {bid, *state.batches}:
            store.tokens.pop((state.request_id, b), None)

    def _forget(self, store: "RunStore", bids: list[int]) -> None:
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

    def _forget_request(self, store: "RunStore", state: RequestState) -> None:
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

    def _forget_batch(self, store: "RunStore", bid: int) -> None:
        store.launches.pop(bid, None)
        store.dones.pop(bid, None)
        store.batch_requests.pop(bid, None)
        self._taken_batches.discard(bid)
