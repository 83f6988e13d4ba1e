"""StoreView: what a run's tables are built from, a RunStore's joined events as one typed, read-only value.

The store hands one over (RunStore.view()) each time tables are built; collector.tables and collector.merge
read nothing else of the store, so neither imports it and the store imports them without a circle. Its
mappings are the store's own (not copies): a view holds for the build it was taken for.
"""
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from batchlab.collector.request import NAN, HeldTokens, RequestState
from batchlab.protocol import BatchDone, BatchLaunch, RunEnd, Step, WorkerBye


@dataclass(frozen=True, slots=True)
class StoreView:
    """A RunStore's state as the tables read it (times on the scheduler's clock; `t0` converts them)."""

    settings: Mapping[str, object]  # RunInfo's
    t0: float  # scheduler-clock time of planned offset 0
    requests: Mapping[int, RequestState]  # in memory
    tokens: Mapping[tuple[int, int], HeldTokens]  # (request_id, batch_id) -> its held tokens
    launches: Mapping[int, BatchLaunch]  # batch_id -> the launch that ran it
    dones: Mapping[int, BatchDone]
    steps: Sequence[Step]  # not yet taken
    run_end: RunEnd | None
    byes: Mapping[str, WorkerBye]
    engine_metrics: Mapping[int, dict]  # request_id -> an engine's own stamps (BatchDone)
    engine_keys: Set[str]  # every key seen in engine_metrics
    counters: Mapping[str, int]  # rejected messages, ignored tokens, duplicate terminals
    arrivals: int  # requests whose Arrival came
    peak_memory_bytes: int  # the largest a BatchDone reported

    def counting_batch(self, state: RequestState) -> int:
        """The attempt that counts: the batch that made it terminal, else its last non-OOM batch (-1: none)."""
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
        held = self.tokens.get((state.request_id, bid))
        if held:
            times = held.times
            first = first if n else float(times[0])
            n, last = n + len(times), float(times[-1])
        return n, first, last
