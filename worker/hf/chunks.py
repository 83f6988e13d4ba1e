"""Stall-free chunked prefill for the continuous HF loop (worker.hf.continuous), as Sarathi-Serve's.

A step has a token budget (`--max-num-batched-tokens`): the running rows' decodes come first (one token
each), and what is left goes to the prompts of the rows being prefilled, oldest first. A prompt longer than
what is left is prefilled over several steps (its chunks go into its slot, each attending causally over the
row's earlier chunks), so a running row never waits for more than one chunk between two of its tokens; the
row gets its first token when its last chunk runs. A run's budget 0 means the default here
(DEFAULT_BATCHED_TOKENS); a budget above the longest prompt plus the rows prefills every prompt whole in the
step it joins, as without chunking.

Chunking is on by default because it cuts the longest gap a running row sees while a long prompt joins,
for a little more time to the joiner's first token (docs/workers.md gives the measured table).

This module is the pure part: the row record and the plan of one step's chunks.
"""
from dataclasses import dataclass
from itertools import accumulate

from batchlab.worker.backend import BackendError, BackendRequest

# the HF continuous loop's budget (tokens per step) when the run sets none (0), by device type: 256 as
# measured on CPU (see above); on CUDA 2048, vLLM's chunked-prefill default (not measured here: a smaller
# chunk leaves a GPU's prefill underused, so a long prompt's first token would wait several forwards)
DEFAULT_BATCHED_TOKENS = {"cpu": 256, "cuda": 2048}


@dataclass(slots=True)
class HFContinuousRequest:
    """A row in flight: `context` (prefix + prompt + tokens so far) is what a (re)prefill reads; `filled`
    tokens of it are in the cache while the row is prefilled."""

    row: BackendRequest
    context: list[int]
    generated: int = 0
    filled: int = 0

    def remaining(self) -> int:
        return self.row.output_len - self.generated

    def unfilled(self) -> int:
        """Context tokens not yet prefilled."""
        return len(self.context) - self.filled


def step_budget(configured: int, max_rows: int, device: str = "cpu") -> int:
    """The per-step token budget from the run's setting (0: DEFAULT_BATCHED_TOKENS for the device type, at
    least `max_rows`); a budget below `max_rows` is refused: that many decodes would leave no prefill token."""
    if configured < 0:
        raise BackendError(f"--max-num-batched-tokens must be ≥ 0, got {configured}")
    if not configured:
        return max(DEFAULT_BATCHED_TOKENS.get(device, DEFAULT_BATCHED_TOKENS["cpu"]), max_rows)
    if configured < max_rows:
        raise BackendError(f"--max-num-batched-tokens {configured} is below the row cap {max_rows}: a step "
                           "of that many decodes would leave no token for a prompt (vLLM refuses it too)")
    return configured


def plan_chunks(tokens: int | None, unfilled: list[int]) -> list[int]:
    """Prompt tokens each prefilling row (oldest first) runs this step, `tokens` in all (None: no limit):
    the oldest rows whole, the next one in part; rows that get nothing are left off."""
    if tokens is None:
        return list(unfilled)
    before = accumulate(unfilled, initial=0)  # tokens of the older rows, planned first
    return [min(n, tokens - planned) for n, planned in zip(unfilled, before) if planned < tokens]


def pads_chunks(padded: bool, fused: bool, decoding: bool) -> bool:
    """Whether a step's prompt chunks run padded to the longest: on a padded worker, unless its one fused forward
    packs them beside the decodes (the HF loop's slot cache: worker.hf.slots.fused_inputs)."""
    return padded and not (fused and decoding)


def chunk_shape(fills: list[int], counts: list[int]) -> tuple[int, int, int]:
    """(rows, the longest chunk, Σ (f + n)² − f² token pairs) of a step's chunks: counts[j] tokens after fills[j]
    prefilled (a chunk attends over its row's earlier chunks); what a step record says of its prefill."""
    ran = [(f, n) for f, n in zip(fills, counts) if n]
    return len(ran), max((n for _, n in ran), default=0), sum((f + n) * (f + n) - f * f for f, n in ran)


def chunks_of(lives: list[HFContinuousRequest], counts: list[int]) -> list[list[int]]:
    """The token ids of each row's next chunk (its `counts[j]` tokens after what is filled)."""
    return [lv.context[lv.filled:lv.filled + n] for lv, n in zip(lives, counts)]
