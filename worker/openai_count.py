"""The `openai` backend's pure parts: the token-count rule and vLLM's prefix-cache counters (I/O: openai_client).

The OpenAI stream carries text, not tokens. Per chunk, the first rule that applies:
  1. the choice carries `token_ids` (vLLM `return_token_ids`): exactly those ids;
  2. the chunk carries `usage.completion_tokens` (vLLM/SGLang `continuous_usage_stats`): the increase
     since the previous chunk, ids -1;
  3. otherwise one token per chunk with non-empty text, id -1 — a guess, so such chunks are held back
     until the final usage report and then corrected: a shortfall is added to the last chunk, an excess
     is taken from the latest chunks.
The emitted total always equals the final `usage.completion_tokens` (or the counted total when the
server sends no usage). A request whose total differs from its output_len fails with the reason.
"""
from dataclasses import dataclass, field

from batchlab.protocol.status import FailureKind, detailed
from batchlab.worker.backend import BackendRequest


@dataclass(slots=True)
class Chunk:
    """Tokens of one request received at `time`; `end` is set on its last chunk."""

    request_id: int
    time: float
    token_ids: list[int]
    end: str | None = None  # None: more to come; "ok": finished; otherwise the failure reason


@dataclass(slots=True)
class OpenAIStreamRequest:
    """Counting one stream under the rule in the module docstring."""

    row: BackendRequest
    seen: int = 0  # tokens emitted or held so far
    held: list[Chunk] = field(default_factory=list)  # rule-3 chunks awaiting the usage report
    usage_total: int | None = None


def count_chunk(tally: OpenAIStreamRequest, obj: dict, t: float) -> Chunk | None:
    """Apply the counting rule to one parsed chunk; returns a chunk to emit now, or None."""
    choices, usage = obj.get("choices") or [], obj.get("usage")
    if not choices:  # the final usage-only chunk
        if usage:
            tally.usage_total = int(usage.get("completion_tokens", 0))
        return None
    choice = choices[0]
    if choice.get("token_ids"):
        ids = [int(i) for i in choice["token_ids"]]
    elif usage and usage.get("completion_tokens") is not None:
        ids = [-1] * max(0, int(usage["completion_tokens"]) - tally.seen)
    else:
        if choice.get("text"):
            tally.held.append(Chunk(tally.row.request_id, t, [-1]))
            tally.seen += 1
        return None
    tally.seen += len(ids)
    return Chunk(tally.row.request_id, t, ids) if ids else None


def settle(tally: OpenAIStreamRequest, t: float) -> list[Chunk]:
    """Correct the held chunks against the usage report; the last returned chunk carries `end`."""
    total = tally.usage_total if tally.usage_total is not None else tally.seen
    diff, held = total - tally.seen, tally.held
    if diff > 0:
        held = held or [Chunk(tally.row.request_id, t, [])]
        held[-1].token_ids.extend([-1] * diff)
    for chunk in reversed(held):
        while diff < 0 and chunk.token_ids:
            chunk.token_ids.pop()
            diff += 1
    out = [c for c in held if c.token_ids] or [Chunk(tally.row.request_id, t, [])]
    want = tally.row.output_len
    short = detailed(FailureKind.STREAM_ERROR, f"server returned {total} of {want} tokens")
    out[-1].end = "ok" if total == want else short
    return out


def parse_prefix_cache_counters(text: str) -> dict[str, float]:
    """{'queries': Σ, 'hits': Σ} from vLLM's /metrics text (every label set summed); {} if absent."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        for key, name in (("queries", "vllm:prefix_cache_queries_total"), ("hits", "vllm:prefix_cache_hits_total")):
            if line.startswith(name) and (len(line) == len(name) or line[len(name)] in "{ "):
                try:
                    totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    continue
    return totals if len(totals) == 2 else {}
