"""A batching strategy written outside batchlab, as a user would: static batches sized by prompt tokens.

Dynamic batching caps a batch by its number of requests; this one caps it by the prompt tokens it
holds, so a batch of long prompts launches sooner and a batch of short ones grows larger. Run it:

    PYTHONPATH=examples/strategies batchlab run --backend sim --dataset synthetic \
        --strategy token_budget:TokenBudget --strategy-arg max_batch_tokens=1024
    PYTHONPATH=examples/strategies batchlab simulate --strategy token_budget:TokenBudget
"""
from collections.abc import Sequence
from dataclasses import dataclass

from batchlab.api.strategy import Capacity, Decision, Policy, Request


@dataclass
class Params:
    """--strategy-arg KEY=VALUE sets these; one named like a run option takes that option's value when the run
    gives it, else keeps its default here."""

    max_batch_tokens: int = 2048  # prompt tokens per batch
    max_batch_size: int = 16  # rows per batch (and the worker's rows): --max-batch-size
    max_wait_ms: float = 50.0  # the oldest request waits no longer than this: --max-wait-ms


class TokenBudget(Policy):
    """Launch the oldest requests once the next one would overflow the token budget, once the batch is
    full, or once the oldest has waited max_wait_ms; an OOM halves the budget."""

    name = "token_budget"
    mode = "static"  # whole batches; "continuous" would admit requests at step boundaries
    Params = Params

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.budget = params.max_batch_tokens

    def decide(self, queue: Sequence[Request], now: float, cap: Capacity,
               end_of_stream: bool) -> Decision:
        """Launch queue[:n] with a reason, or ask to be woken when the oldest request is due."""
        if cap.free_slots <= 0 or not queue:
            return Decision()
        rows = min(self.params.max_batch_size, cap.free_slots)
        n, tokens = 0, 0
        for request in queue[:rows]:
            if n and tokens + request.prompt_len > self.budget:
                return Decision(n, "tokens")
            n, tokens = n + 1, tokens + request.prompt_len
        if n == rows:
            return Decision(n, "size")
        deadline = queue[0].arrival_time + self.params.max_wait_ms / 1000.0
        if now >= deadline:
            return Decision(n, "age")
        if end_of_stream:
            return Decision(n, "flush")
        return Decision(wake_at=deadline)

    def on_batch_done(self, size: int, oom: bool) -> None:
        """An out-of-memory batch comes back to the queue: retry it smaller."""
        if oom:
            self.budget = max(1, self.budget // 2)
