"""Exact statistics of more values than memory should hold, read in chunks (one pass per call of a
`Chunks` function): the mean from an exact sum (math.fsum, so it does not depend on how the values
are chunked or ordered) and percentiles equal to np.percentile's (linear method).

A percentile is one or two order statistics; each is found by radix selection on the values' bit
patterns: a pass counts the values in 65,536 buckets (the next 16 bits of the key), which names the
bucket holding the wanted rank; once that bucket holds at most CANDIDATES_MAX values a last pass
keeps only those and selects exactly. Memory: a histogram (512 KiB) or CANDIDATES_MAX values per rank.
"""
import math
from collections.abc import Callable, Iterable, Iterator
from itertools import chain

import numpy as np

BUCKET_BITS = 16
CANDIDATES_MAX = 1 << 18  # values kept for an exact selection (2 MiB)
_SIGN = np.uint64(1 << 63)

Chunks = Callable[[], Iterable[np.ndarray]]  # each call: a fresh pass over the values (float64, no NaN)


def exact_sum(values: Iterable[float]) -> float:
    """The correctly rounded sum (NaN when +inf and -inf meet or a partial sum overflows)."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return float("nan")


def sortable_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys ordered as the float64 values are (negative values: every bit flipped)."""
    bits = values.view(np.uint64)
    return np.where(bits >= _SIGN, ~bits, bits | _SIGN)


def key_value(key: int) -> float:
    """The float64 value of one key (the inverse of sortable_keys)."""
    k = np.uint64(key)
    bits = k & ~_SIGN if k >= _SIGN else ~k
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


def lerp(a: float, b: float, t: float) -> float:
    """numpy's linear interpolation between two order statistics (np.percentile's `_lerp`)."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def percentile_ranks(n: int, q: float) -> tuple[int, int, float]:
    """np.percentile's (linear) neighbouring ranks and weight for the q-th percentile of n values."""
    virtual = (n - 1) * (np.float64(q) / 100)
    if virtual >= n - 1:
        return n - 1, n - 1, 0.0
    lo = int(np.floor(virtual))
    return lo, lo + 1, float(virtual - lo)


def _in_group(keys: np.ndarray, bits: int, prefix: int) -> np.ndarray | slice:
    """Which keys start with `prefix` (their top `bits` bits)."""
    if bits == 0:
        return slice(None)
    return (keys >> np.uint64(64 - bits)) == np.uint64(prefix)


def _pass(chunks: Chunks, hist_groups: set, keep_groups: set) -> tuple[dict, dict]:
    """One read: a histogram of the next 16 bits per group in `hist_groups`, the values per group in
    `keep_groups` (a group: (bits, prefix))."""
    hists = {g: np.zeros(1 << BUCKET_BITS, dtype=np.int64) for g in hist_groups}
    kept: dict[tuple, list[np.ndarray]] = {g: [] for g in keep_groups}
    for chunk in chunks():
        keys = sortable_keys(chunk)
        for (bits, prefix), hist in hists.items():
            sub = keys[_in_group(keys, bits, prefix)]
            digits = (sub >> np.uint64(64 - BUCKET_BITS - bits)) & np.uint64((1 << BUCKET_BITS) - 1)
            hist += np.bincount(digits.astype(np.intp), minlength=1 << BUCKET_BITS)
        for (bits, prefix), values in kept.items():
            values.append(chunk[_in_group(keys, bits, prefix)])
    return hists, kept


def select_ranks(chunks: Chunks, n: int, ranks: Iterable[int]) -> dict[int, float]:
    """The values at these 0-based ranks of the sorted n values, exactly."""
    # rank -> (bits fixed, prefix of that many bits, rank among the values with that prefix, their count)
    todo = {r: (0, 0, r, n) for r in set(ranks)}
    found: dict[int, float] = {}
    while todo:
        for r, (bits, prefix, _, _) in list(todo.items()):
            if bits == 64:  # one key: every value in the group is this one
                found[r] = key_value(prefix)
                del todo[r]
        keep = {(b, p) for b, p, _, count in todo.values() if count <= CANDIDATES_MAX}
        hists, kept = _pass(chunks, {(b, p) for b, p, _, _ in todo.values()} - keep, keep) if todo else ({}, {})
        for r, (bits, prefix, within, _) in list(todo.items()):
            if (bits, prefix) in kept:
                values = np.concatenate(kept[(bits, prefix)])
                found[r] = float(np.partition(values, within)[within])
                del todo[r]
                continue
            cum = np.cumsum(hists[(bits, prefix)])
            digit = int(np.searchsorted(cum, within, side="right"))
            before = int(cum[digit - 1]) if digit else 0
            todo[r] = (bits + BUCKET_BITS, (prefix << BUCKET_BITS) | digit, within - before,
                       int(cum[digit]) - before)
    return found


def chunked_percentiles(chunks: Chunks, stats: tuple[str, ...]) -> dict:
    """metrics.percentiles' statistics ("mean", "pNN", "max_abs") of every value the chunks hold,
    equal to it over the concatenated values, in bounded memory."""
    n, low, high = 0, math.inf, -math.inf

    def counted() -> Iterator[list[float]]:
        nonlocal n, low, high
        for chunk in chunks():
            if len(chunk):
                n, low, high = n + len(chunk), min(low, float(chunk.min())), max(high, float(chunk.max()))
                yield chunk.tolist()

    total = exact_sum(chain.from_iterable(counted()))
    if n == 0:
        return dict.fromkeys(stats)
    out = {"mean": total / n, "max_abs": max(abs(high), abs(low))}
    wanted = {s: percentile_ranks(n, float(s[1:])) for s in stats if s.startswith("p")}
    values = select_ranks(chunks, n, [r for lo, hi, _ in wanted.values() for r in (lo, hi)]) if wanted else {}
    out |= {s: lerp(values[lo], values[hi], t) for s, (lo, hi, t) in wanted.items()}
    return {s: float(out[s]) for s in stats}
