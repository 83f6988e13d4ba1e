"""PartTaking, the RunStore's way out: rows new since the last take go to part files, and what was
written leaves memory, so the store follows what is in flight, not how long the run is.

A request's tokens are kept (two typed arrays, 16 bytes a token) until its rows are taken; its request
row is written then too, once it is terminal. It stays in memory KEEP_TAKES more takes (a late token,
arrival or launch writes its row again; the merge keeps a request's last row), then leaves: only its
id stays, as a bit in `ended`. A batch's launch and completion leave with the last request in memory
that refers to them, once the batch's row is written. The final tables are merged from the part files
(collector.merge).
"""
import pandas as pd

from batchlab.collector import tables
from batchlab.collector.state import RequestState

KEEP_TAKES = 10  # takes a written request stays for late events (the collector takes once a second)


class PartTaking:
    """take_parts and the forgetting that follows it (mixed into RunStore, whose state it reads)."""

    # --- output --------------------------------------------------------------------------------
    def take_parts(self, *, final: bool = False) -> dict[str, pd.DataFrame]:
        """Rows new since the last call, per table (waits for RunInfo's t0 unless `final`, which takes
        every row still in memory); what was written long enough ago leaves memory."""
        if "t0" not in self.settings and not final:
            return {}
        t0, self._takes = self.t0(), self._takes + 1
        rids = self._ready_requests(final)
        written = rids + sorted(r for r in self._late.difference(rids) if r in self.requests)
        self._late = set()
        bids = self._ready_batches(final)
        steps = self.steps[:]
        del self.steps[:]
        self.steps_taken += len(steps)
        engine = {r: self.engine_metrics[r] for r in written if r in self.engine_metrics}
        parts = {"requests": tables.engine_columns(tables.requests_frame(self, written, t0), engine, t0),
                 "tokens": tables.tokens_frame(self, written, t0),
                 "batches": tables.batches_frame(self, bids, t0),
                 "steps": tables.steps_frame(steps, t0)}
        for rid in written:
            self._fold_tokens(self.requests[rid])
        self._retained.append((self._takes, written))
        self._forget(bids)
        return {name: df for name, df in parts.items() if not df.empty}

    def _ready_requests(self, final: bool) -> list[int]:
        """Terminal requests whose row is complete (arrival in, terminal batch launched); `final`:
        every request not written yet."""
        if final:
            self._new_terminal = []
            return sorted(r for r, s in self.requests.items() if s.taken_batch is None)
        ready, waiting = [], []
        for rid in self._new_terminal:
            state = self.requests[rid]
            settled = state.arrival is not None and (state.terminal_batch is None
                                                     or state.terminal_batch in self.launches)
            (ready if settled else waiting).append(rid)
        self._new_terminal = waiting
        return ready

    def _ready_batches(self, final: bool) -> list[int]:
        """Done batches whose launch is in; `final`: every batch not written yet."""
        if final:
            self._pending_batches = []
            return sorted((set(self.launches) | set(self.dones)) - self._taken_batches)
        bids = list(dict.fromkeys(b for b in self._pending_batches if b in self.launches))
        taken = set(bids)  # a set: continuous runs have one batch per request (a list made this O(n²))
        self._pending_batches = [b for b in self._pending_batches if b not in taken]
        return bids

    def _fold_tokens(self, state: RequestState) -> None:
        """Keep the counting attempt's count and first/last time; drop every held token of the request."""
        bid = self.counting_batch(state)
        state.taken, state.taken_batch, state.taken_at = self.token_stats(state, bid), bid, self._takes
        for b in {bid, *state.batches}:
            self.tokens.pop((state.request_id, b), None)

    def _forget(self, bids: list[int]) -> None:
        """Batches just written leave memory unless a request in memory refers to them; terminal
        requests written KEEP_TAKES takes ago (and not since) leave it."""
        for bid in bids:
            if self.batch_refs.get(bid, 0):
                self._taken_batches.add(bid)
            else:
                self._forget_batch(bid)
        while self._retained and self._retained[0][0] <= self._takes - KEEP_TAKES:
            take, rids = self._retained.popleft()
            for rid in rids:
                state = self.requests.get(rid)
                if state is not None and state.status and state.taken_at == take:
                    self._forget_request(state)

    def _forget_request(self, state: RequestState) -> None:
        rid = state.request_id
        del self.requests[rid]
        self.ended.add(rid)
        self.engine_metrics.pop(rid, None)
        for bid in state.batches:
            self.tokens.pop((rid, bid), None)
            refs = self.batch_refs.pop(bid, 0) - 1
            if refs > 0:
                self.batch_refs[bid] = refs
            elif bid in self._taken_batches:
                self._forget_batch(bid)

    def _forget_batch(self, bid: int) -> None:
        self.launches.pop(bid, None)
        self.dones.pop(bid, None)
        self.batch_requests.pop(bid, None)
        self._taken_batches.discard(bid)
