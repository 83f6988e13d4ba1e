"""A request's terminal status and why a request failed: the closed sets written to requests.parquet's
`status` and `error` columns, declared once.

Both are `StrEnum`s: a member is the very string a file holds (and compares equal to it), so the values
written stay what they were and an old folder's plain strings still match. A failure reason is either
one of `FailureReason`'s fixed texts, or a `FailureKind` followed by free text that only the moment of
failure knows (an exception's message, a worker's name, a count): `detailed(kind, text)` writes it as
"<kind>: <text>". A backend's own message (vLLM's "returned n of m tokens", hf's sliding window refusal) and a
plugin strategy's reject reason stay free text.
"""
from enum import StrEnum


class RequestStatus(StrEnum):
    """How a request ended: every request has exactly one, in requests.parquet's `status` column."""

    FINISHED = "finished"  # got exactly its output_len tokens
    FAILED = "failed"  # ended otherwise: its `error` says why


class FailureReason(StrEnum):
    """The fixed failure reasons (requests.parquet's `error` column)."""

    NOT_SENT = "not sent: traffic stopped before its planned time"  # the collector, for a schedule row
    NO_TERMINAL = "no terminal record: run ended before it completed"  # the collector, at the run's end
    QUEUE_FULL = "queue full"  # the scheduler's queue limit
    NO_WORKER_LEFT = "worker lost: no worker left"  # queued with no worker back within the grace
    OOM_ALONE = "out of memory: does not fit alone"  # a batch of one ran out of memory (static)
    REJOINED = "worker rejoined: its running requests were lost"
    DEADLINE = "deadline"  # a strategy rejected it: its TTFT deadline passed while it queued (edf)
    REJECTED = "rejected by the strategy"  # a strategy rejected it without a reason of its own
    NOT_STARTED = "worker stopped before the request started"  # a deferred Dispatch never ran
    STOPPED = "worker stopped before the batch finished"  # a signal or Shutdown abandoned its batch
    UNFINISHED = "worker stopped before the request finished"  # a continuous worker stopped with it running
    OOM_PROMPT_ALONE = "out of memory: the prompt does not fit alone"  # continuous hf, prefilling alone
    OOM_ROW_ALONE = "out of memory: the row does not fit alone"  # continuous hf, decoding alone


class FailureKind(StrEnum):
    """The kinds of failure whose reason carries free text after the kind: "<kind>: <text>"."""

    WORKER_LOST = "worker lost"  # text: the worker's id
    WORKER_ERROR = "worker error"  # text: the exception's type and message
    REFUSED = "refused"  # a worker refused the batch; text: why (admission)
    STALLED = "stalled"  # the strategy launched nothing on idle workers for too long; text: how long, how many
    VLLM_REJECTED = "vllm rejected"  # text: the exception's type and message
    STREAM_ERROR = "stream error"  # an OpenAI-compatible server's stream; text: what went wrong
    SCHEDULER_STOPPED = "scheduler stopped"  # it stopped with the request queued; text: why


def detailed(kind: FailureKind, text: str) -> str:
    """A failure reason of `kind` with its free text."""
    return f"{kind}: {text}"

