"""Token times of a simulated run, kept as array slices, and the run's tokens table built from them.

A live worker streams one Tokens message per step and the collector's RunStore holds each attempt's tokens
in a TokenBuffer (collector.request.HeldTokens, the layout it declares). Here a request's token times are a
slice of its batch's step-end times (static) or of its worker's step-end times (continuous), so the tokens
table is built with numpy, and RunStore holds each request's tokens as a read-only `TokenView` of that layout.
Everything else in the tables comes from the collector's own functions.
"""
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchlab.collector import tables
from batchlab.collector.store import RunStore
from batchlab.collector.tables import TOKEN_DTYPES
from batchlab.protocol import Tokens
from batchlab.worker.sim import fake_token


class TokenView(Sequence):
    """A request's tokens in the layout RunStore holds (collector.request.HeldTokens), over an array of times."""

    __slots__ = ("times", "request_id")

    def __init__(self, times: np.ndarray, request_id: int) -> None:
        self.times, self.request_id = times, request_id

    @property
    def ids(self) -> np.ndarray:
        """Its token ids, in order (the sim backend's fake tokens)."""
        return fake_token(self.request_id, np.arange(len(self.times), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]  # normalises negatives, raises IndexError
        return float(self.times[i]), fake_token(self.request_id, i)


@dataclass(slots=True)
class _Span:
    request_id: int
    batch_id: int
    source: object  # np.ndarray of step ends (static batch) or a worker id (continuous)
    start: int  # index of the request's first token in `source`
    n_tokens: int
    steps: list[int] | None = None  # the step indices of its tokens in `source`, when not consecutive


@dataclass(slots=True)
class Recorder:
    """Where each request's tokens lie in virtual time."""

    spans: list[_Span] = field(default_factory=list)
    step_ends: dict[str, list[float]] = field(default_factory=dict)  # worker -> continuous step end times

    def static_batch(self, batch_id: int, rows: list[tuple[int, int]], ends_s: np.ndarray) -> None:
        """A lockstep batch: row (request_id, output_len) gets its tokens at ends_s[:output_len]."""
        for rid, output_len in rows:
            self.spans.append(_Span(rid, batch_id, ends_s, 0, output_len))

    def joined(self, worker: str, request_id: int, batch_id: int, output_len: int) -> None:
        """A continuous row joins the worker's next step (call before that step's end is recorded)."""
        ends = self.step_ends.setdefault(worker, [])
        self.spans.append(_Span(request_id, batch_id, worker, len(ends), max(output_len, 1)))

    def at_steps(self, worker: str, request_id: int, batch_id: int, steps: list[int]) -> None:
        """A continuous row whose tokens came at these steps of its worker (a core whose rows skip steps)."""
        self.spans.append(_Span(request_id, batch_id, worker, 0, len(steps), steps))

    def step_end(self, worker: str, time_s: float) -> None:
        """A continuous step of `worker` ended."""
        self.step_ends.setdefault(worker, []).append(time_s)

    def _times(self) -> list[tuple[_Span, np.ndarray]]:
        arrays = {w: np.asarray(t, dtype=np.float64) for w, t in self.step_ends.items()}
        out = []
        for s in sorted(self.spans, key=lambda s: s.request_id):
            src = arrays[s.source] if isinstance(s.source, str) else s.source
            out.append((s, src[s.steps] if s.steps is not None else src[s.start: s.start + s.n_tokens]))
        return out

    def attach(self, store: RunStore) -> pd.DataFrame:
        """Give `store` each request's tokens (as views); return the tokens table (times since t0)."""
        return _tokens_frame(self.hold_in(store), store.t0())

    def hold_in(self, store: RunStore) -> list[tuple[_Span, np.ndarray]]:
        """Give `store` each request's tokens (as views), without the tokens table; their spans and times."""
        spans = self._times()
        for s, times in spans:
            store.hold(s.request_id, s.batch_id, TokenView(times, s.request_id))
        return spans

    def token_messages(self) -> list[Tokens]:
        """The tokens as a live worker streams them, one message per token, each with its batch: the
        slow route through RunStore, for checking the fast one."""
        out = []
        for s, times in self._times():
            out += [Tokens(i, float(t), [s.request_id], [s.batch_id], [fake_token(s.request_id, i)])
                    for i, t in enumerate(times)]
        return out


def _tokens_frame(spans: list[tuple[_Span, np.ndarray]], t0: float) -> pd.DataFrame:
    """collector.tables.tokens_frame's rows, vectorised: by request id, tokens in time order."""
    if not spans:
        return tables.frame([], TOKEN_DTYPES)
    counts = np.array([len(t) for _, t in spans], dtype=np.int64)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    rids = np.repeat(np.array([s.request_id for s, _ in spans], dtype=np.int64), counts)
    index = np.arange(int(counts.sum()), dtype=np.int64) - starts
    return pd.DataFrame({
        "request_id": rids, "token_index": index, "token_id": fake_token(rids, index),
        "time": np.concatenate([t for _, t in spans]) - t0,
        "batch_id": np.repeat(np.array([s.batch_id for s, _ in spans], dtype=np.int64), counts),
    }).astype(TOKEN_DTYPES)
