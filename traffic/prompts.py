"""Choose the k-th request's prompt and output length from a seeded stream, independent of n.

Request k gets the same prompt whatever the number of requests (hence whatever the rate): ShareGPT
walks one fixed seeded permutation of the conversations; synthetic draws in fixed-size blocks.
"""
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from batchlab.traffic.config import TrafficConfig
from batchlab.traffic.datasets import DatasetError, ParseResult, sample_lengths, synthetic_tokens

SYNTHETIC_BLOCK = 256  # requests drawn per block, so request k's draws do not depend on n
MIN_REPLY_TOKENS = 2  # shorter replies are dropped, as vLLM's ShareGPT sampler does
REPLY_PREFIX_CHARS_PER_TOKEN = 8  # a reply is first tokenized only this many chars per needed token
REPLY_MARGIN_TOKENS = 8  # a prefix this far past the cap proves the whole reply reaches it


class Tokenizer(Protocol):
    """Anything with encode(text) -> token ids (the model's tokenizer)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(slots=True)
class Prompts:
    """Per-request prompt text, tokens and output length, in request order."""

    texts: list[str] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)


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
    """(prompt tokens, output_len) for one conversation, or None if it fails the length filters."""
    tokens = list(tokenizer.encode(prompt))
    if not cfg.min_prompt_len <= len(tokens) <= cfg.max_prompt_len:
        return None
    reply_len = _reply_len(reply, tokenizer, cfg.max_new_tokens)
    if reply_len < MIN_REPLY_TOKENS:
        return None
    return tokens, min(reply_len, cfg.max_new_tokens)


def sharegpt_prompts(pairs: ParseResult, n: int, tokenizer: Tokenizer, cfg: TrafficConfig,
                     rng: np.random.Generator) -> Prompts:
    """`n` prompts walking a seeded permutation of the conversations (repeating it if n is larger).

    Prompts shorter than min_prompt_len or longer than max_prompt_len tokens are dropped, not
    truncated (as vLLM does), so the text always matches its tokens. Only visited conversations are
    tokenized.
    """
    order = rng.permutation(len(pairs.prompts)).tolist()
    memo: dict[int, tuple[list[int], int] | None] = {}
    out = Prompts()
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
        tokens, output_len = memo[idx]
        out.texts.append(pairs.prompts[idx])
        out.tokens.append(tokens)
        out.output_lens.append(output_len)
    return out


def synthetic_prompts(n: int, cfg: TrafficConfig, rng: np.random.Generator) -> Prompts:
    """`n` text-free prompts: lengths from the config's distributions, uniform token ids."""
    out = Prompts()
    while len(out.tokens) < n:
        prompt_lens = sample_lengths(cfg.prompt_lengths, SYNTHETIC_BLOCK, rng)
        prompt_lens = np.clip(prompt_lens, cfg.min_prompt_len, cfg.max_prompt_len)
        output_lens = np.clip(sample_lengths(cfg.output_lengths, SYNTHETIC_BLOCK, rng), 1, cfg.max_new_tokens)
        out.tokens.extend(synthetic_tokens(prompt_lens, cfg.vocab_size, rng))
        out.output_lens.extend(output_lens.tolist())
    del out.tokens[n:], out.output_lens[n:]
    out.texts = [""] * n
    return out
