"""What a continuous worker's timing core plans for one step (worker.sim.ContinuousCore, worker.vllm_v0.V0Core)."""
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepPlan:
    """One planned continuous step: its duration, who joined (prefilled) and who finished in it.

    `request_ids[i]` yields its `token_indices[i]`-th token at the step's end (filled only when asked:
    the simulator needs no per-row lists)."""

    step: int
    duration_s: float
    joined: list[int]  # request ids prefilled in this step (their token 0 ends it)
    finished: list[int]  # request ids whose last token ends this step
    running: int  # rows in the step, joiners included
    prefill_tokens: int = 0  # prompt tokens prefilled in it (its chunks: whole prompts without a budget)
    prefill_rows: int = 0  # rows that ran a chunk in it
    prefill_width: int = 0  # the longest chunk
    prefill_pairs: int = 0  # Σ (f + n)² − f² over its chunks (worker.hf.chunks.chunk_shape)
    request_ids: list[int] = field(default_factory=list)
    token_indices: list[int] = field(default_factory=list)
    # a core whose running rows skip some steps (every_step False): each finisher's token step numbers, in order
    token_steps: dict[int, list[int]] = field(default_factory=dict)
