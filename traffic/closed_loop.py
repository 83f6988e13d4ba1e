"""Closed-loop load, pure: N clients take a schedule's requests in order; each sends its next request when
its last one ended plus the think time. No socket, no clock: every time is given (traffic/process.py
gives its monotonic clock, the simulator virtual time)."""
import heapq
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class ClientPool:
    """The clients' state: who may send when, which requests are out. A request's id is its index in the
    schedule (request_id 0..n-1, as schedules number them)."""

    clients: int
    n_requests: int  # the schedule's length: no request after the last
    think_s: float = 0.0
    stop_at: float = math.inf  # no send at or after this time (t0 + duration_s)
    next_index: int = 0
    ready: list[float] = field(default_factory=list)  # heap: when each idle client may send next
    outstanding: set[int] = field(default_factory=set)  # sent, not ended yet

    def start(self, t0: float) -> None:
        """Every client is ready at t0 (a list of equal times is a heap)."""
        self.ready = [t0] * self.clients

    def on_ended(self, request_ids: list[int], t: float) -> list[float]:
        """These requests ended by `t`: each frees its client at t + think_s. An id not out (ended
        already, never sent) is ignored, so a request's end counts once. Returns when the freed clients
        may send (one time each)."""
        freed = []
        for rid in request_ids:
            if rid in self.outstanding:
                self.outstanding.discard(rid)
                heapq.heappush(self.ready, t + self.think_s)
                freed.append(t + self.think_s)
        return freed

    def due(self, t: float) -> list[tuple[int, float]]:
        """(request index, time its client became ready) of what to send at `t`, in schedule order: one per
        client ready by then, while requests are left and before the stop."""
        out = []
        while self.ready and self.ready[0] <= t and self._may_send(self.ready[0]):
            ready_at = heapq.heappop(self.ready)
            out.append((self.next_index, ready_at))
            self.outstanding.add(self.next_index)
            self.next_index += 1
        return out

    def next_send_at(self) -> float | None:
        """When the next send is due (None: none until a request ends, or none at all)."""
        return self.ready[0] if self.ready and self._may_send(self.ready[0]) else None

    def done(self, t: float) -> bool:
        """Nothing more will be sent: the schedule ran out, or the stop passed (at `t`, or before any
        client could send again)."""
        if self.next_index >= self.n_requests or t >= self.stop_at:
            return True
        earliest = self.ready[0] if self.ready else (t if self.outstanding else math.inf)
        return earliest >= self.stop_at

    def _may_send(self, t: float) -> bool:
        return self.next_index < self.n_requests and t < self.stop_at
