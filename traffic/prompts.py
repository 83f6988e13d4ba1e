"""Choose the k-th request's prompt and output length from a seeded stream, independent of n.

Request k gets the same prompt whatever the number of requests (hence whatever the rate): ShareGPT
walks one fixed seeded permutation of the conversations; synthetic draws in fixed-size blocks.
"""
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.datasets import DatasetError, ParseResult, sample_lengths, synthetic_tokens

SYNTHETIC_BLOCK = 256  # requests drawn per block, so request k's draws do not depend on n
MIN_REPLY_TOKENS = 2  # shorter replies are dropped, as vLLM's ShareGPT sampler does
REPLY_PREFIX_CHARS_PER_TOKEN = 8  # a reply is first tokenized only this many chars per needed token
REPLY_MARGIN_TOKENS = 8  # a prefix this far past the cap proves the whole reply reaches it
PROMPT_SOURCES = {
    "sharegpt": "whole prompts of a conversation file (text and its tokens)",
    "synthetic": "uniform random token ids, lengths from the synthetic length settings",
    "sharegpt-cut": "the trace's lengths; ShareGPT prompts' token ids joined and cut to each length",
    "synthetic-ids": "the trace's lengths; uniform random token ids",
}


class Tokenizer(Protocol):
    """Anything with encode(text) -> token ids (the model's tokenizer)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(slots=True)
class Prompts:
    """Per-request prompt text, tokens and output length, in request order."""

    texts: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    source: str = ""  # PROMPT_SOURCES key
    capped_prompts: int = 0  # requests whose prompt was cut to max_prompt_len
    capped_outputs: int = 0  # requests whose output length was cut to max_new_tokens


def _reply_len(reply: str, tokenizer: Tokenizer, cap: int) -> int:
    """Token length of `reply`, exact up to `cap` (only a prefix is tokenized when it already exceeds it)."""
    prefix_chars = REPLY_PREFIX_CHARS_PER_TOKEN * (cap + REPLY_MARGIN_TOKENS)
    if len(reply) > prefix_chars:
        prefix_len = len(tokenizer.encode(reply[:prefix_chars]))
        if prefix_len >= cap + REPLY_MARGIN_TOKENS:
            return prefix_len
    return len(tokenizer.encode(reply))


def _tokenize_pair(prompt: str, reply: str, tokenizer: Tokenizer,
                   cfg: TrafficConfig) -> tuple[list[int], int] | None:
    """(prompt tokens, reply length) for one conversation, or None if it fails the length filters."""
    tokens = list(tokenizer.encode(prompt))
    if not cfg.min_prompt_len <= len(tokens) <= cfg.max_prompt_len:
        return None
    reply_len = _reply_len(reply, tokenizer, cfg.max_new_tokens)
    if reply_len < MIN_REPLY_TOKENS:
        return None
    return tokens, reply_len


# Conversations tokenized in this process, per (pairs, tokenizer, length limits): request k's prompt is the
# same at every rate, so a study's schedules (saturated runs, probes, the twin's long virtual probes) tokenize
# each conversation once. The pairs and the tokenizer are kept beside their memo so their ids stay theirs.
_TOKENIZED: dict[tuple, tuple[ParseResult, Tokenizer, dict[int, tuple[list[int], int] | None]]] = {}
TOKENIZED_KEEP = 4


def _memo(pairs: ParseResult, tokenizer: Tokenizer, cfg: TrafficConfig) -> dict[int, tuple[list[int], int] | None]:
    """The process-wide memo of tokenized conversations for these pairs, tokenizer and length limits."""
    key = (id(pairs), id(tokenizer), cfg.min_prompt_len, cfg.max_prompt_len, cfg.max_new_tokens)
    if key not in _TOKENIZED:
        while len(_TOKENIZED) >= TOKENIZED_KEEP:
            _TOKENIZED.pop(next(iter(_TOKENIZED)))
        _TOKENIZED[key] = (pairs, tokenizer, {})
    return _TOKENIZED[key][2]


def sharegpt_prompts(pairs: ParseResult, n: int, tokenizer: Tokenizer, cfg: TrafficConfig,
                     rng: np.random.Generator) -> Prompts:
    """`n` prompts walking a seeded permutation of the conversations (repeating it if n is larger).

    Prompts shorter than min_prompt_len or longer than max_prompt_len tokens are dropped, not
    truncated (as vLLM does), so the text always matches its tokens. Only visited conversations are
    tokenized.
    """
    order = rng.permutation(len(pairs.prompts)).tolist()
    memo = _memo(pairs, tokenizer, cfg)
    out = Prompts(source="sharegpt")
    visited = 0
    while len(out.texts) < n:
        if visited == len(order) and not out.texts:
            raise DatasetError(f"no conversation has a prompt of {cfg.min_prompt_len}..{cfg.max_prompt_len} "
                               f"tokens and a reply of >= {MIN_REPLY_TOKENS} tokens")
        idx = order[visited % len(order)]
        visited += 1
        if idx not in memo:
            memo[idx] = _tokenize_pair(pairs.prompts[idx], pairs.replies[idx], tokenizer, cfg)
        if memo[idx] is None:
            continue
        tokens, reply_len = memo[idx]
        out.texts.append(pairs.prompts[idx])
        out.tokens.append(list(tokens))  # a copy: the memo's lists are shared by every schedule
        out.output_lens.append(min(reply_len, cfg.max_new_tokens))
        out.capped_outputs += reply_len > cfg.max_new_tokens
    return out


def synthetic_prompts(n: int, cfg: TrafficConfig, rng: np.random.Generator) -> Prompts:
    """`n` text-free prompts: lengths from the config's distributions, uniform token ids."""
    out = Prompts(source="synthetic")
    while len(out.tokens) < n:
        prompt_lens = sample_lengths(cfg.prompt_lengths, SYNTHETIC_BLOCK, rng)
        output_lens = sample_lengths(cfg.output_lengths, SYNTHETIC_BLOCK, rng)
        keep = min(SYNTHETIC_BLOCK, n - len(out.tokens))  # counts cover the n requests only
        out.capped_prompts += int((prompt_lens[:keep] > cfg.max_prompt_len).sum())
        out.capped_outputs += int((output_lens[:keep] > cfg.max_new_tokens).sum())
        prompt_lens = np.clip(prompt_lens, cfg.min_prompt_len, cfg.max_prompt_len)
        out.tokens.extend(synthetic_tokens(prompt_lens, cfg.vocab_size, rng))
        out.output_lens.extend(np.clip(output_lens, 1, cfg.max_new_tokens).tolist())
    del out.tokens[n:], out.output_lens[n:]
    out.texts = [""] * n
    return out


def exact_length_prompts(prompt_lens: np.ndarray, output_lens: np.ndarray, cfg: TrafficConfig,
                         pairs: ParseResult | None, tokenizer: Tokenizer | None,
                         rng: np.random.Generator) -> Prompts:
    """A prompt of exactly min(length, max_prompt_len) tokens per request, outputs cut to max_new_tokens.

    With conversations and a tokenizer the token ids are real text: the prompts of a seeded permutation
    of the conversations, tokenized and joined into one stream that each request takes its next tokens
    from (so request k's prompt does not depend on n, and no two prompts share a prefix until the
    stream wraps). Otherwise uniform random ids. The texts are empty: cut tokens have no exact text.
    """
    out = Prompts(capped_prompts=int((prompt_lens > cfg.max_prompt_len).sum()),
                  capped_outputs=int((output_lens > cfg.max_new_tokens).sum()),
                  output_lens=np.minimum(output_lens, cfg.max_new_tokens).tolist())
    lens = np.minimum(prompt_lens, cfg.max_prompt_len)
    if pairs is not None and tokenizer is not None:
        out.tokens, out.source = _cut_from_stream(lens, _token_stream(pairs, tokenizer, rng)), "sharegpt-cut"
    else:
        out.tokens, out.source = synthetic_tokens(lens, cfg.vocab_size, rng), "synthetic-ids"
    out.texts = [""] * len(lens)
    return out


def _token_stream(pairs: ParseResult, tokenizer: Tokenizer, rng: np.random.Generator) -> Iterator[list[int]]:
    """Token ids of the conversations' prompts in a seeded order, repeating the order when it ends."""
    order = rng.permutation(len(pairs.prompts)).tolist()
    while True:
        produced = 0
        for idx in order:
            tokens = list(tokenizer.encode(pairs.prompts[idx]))
            produced += len(tokens)
            yield tokens
        if not produced:
            raise DatasetError("the conversations' prompts tokenize to no tokens")


def _cut_from_stream(lens: np.ndarray, stream: Iterator[list[int]]) -> list[list[int]]:
    """Consecutive pieces of the stream, one of each length."""
    out: list[list[int]] = []
    buf: list[int] = []
    pos = 0
    for length in lens.tolist():
        while len(buf) - pos < length:
            buf = buf[pos:] + next(stream)  # buf stays short: at most one prompt plus one request
            pos = 0
        out.append(buf[pos:pos + length])
        pos += length
    return out
