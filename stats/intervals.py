"""Intervals that fit how batchlab measures: distribution-free percentile intervals from order statistics,
paired comparisons of two strategies over the same requests, and comparisons whose units are repeats (the
spread between runs, which requests within one run cannot show). Pure numpy; latencies in any one unit."""
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

LEVEL = 0.95
N_BOOT = 2000  # paired-bootstrap resamples
SEED = 0  # the bootstrap's rng seed: the same data always gives the same interval
_TOL = 1e-12  # slack when a binomial sum is compared to the level (rounding, not statistics)
_BLOCK_CELLS = 2_000_000  # resample counts are drawn in blocks of about this many cells (memory bound)
UNMEASURED = "one repeat: run-to-run variation not measured"


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(B ≤ k) for k = 0..n, B ~ Binomial(n, p), built in log space so a large n neither under- nor overflows."""
    k = np.arange(n)
    log_pmf = np.concatenate([[0.0], np.cumsum(np.log((n - k) / (k + 1)) + math.log(p / (1 - p)))])
    pmf = np.exp(log_pmf - log_pmf.max())
    return np.cumsum(pmf) / pmf.sum()


def widest_coverage(n: int, q: float) -> float:
    """Coverage of [min, max] of n values for the q-th percentile: the most any order-statistic interval gives."""
    p = q / 100
    return 1.0 - p**n - (1 - p) ** n


def min_requests(q: float, level: float = LEVEL) -> int:
    """The fewest independent values for which a two-sided order-statistic interval of the q-th percentile exists."""
    if not 0 < q < 100:
        raise ValueError(f"percentile {q} is not strictly between 0 and 100")
    n = 2
    while widest_coverage(n, q) < level - _TOL:
        n += 1
    return n


@lru_cache(maxsize=4096)
def order_ranks(n: int, q: float, level: float = LEVEL) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(l ≤ B < u) ≥ level for B ~ Binomial(n, q/100), u − l smallest, the two
    tails as even as that allows; None when even (1, n) covers less than `level`."""
    if n < 2 or not 0 < q < 100 or widest_coverage(n, q) < level - _TOL:
        return None
    cdf = _binomial_cdf(n, q / 100)
    low = np.arange(1, n + 1)  # candidate l; P(B < l) = cdf[l - 1]
    top = np.searchsorted(cdf, cdf[:-1] + level - _TOL)  # smallest u − 1 with P(l ≤ B ≤ u − 1) ≥ level
    ok = top <= n - 1
    low, up = low[ok], top[ok] + 1
    width = up - low
    best = width == width.min()
    tails_gap = np.abs(cdf[low[best] - 1] - (1 - cdf[up[best] - 1]))  # P(B < l) against P(B ≥ u)
    pick = int(np.argmin(tails_gap))
    return int(low[best][pick]), int(up[best][pick])


def design_effect(values: np.ndarray, clusters: np.ndarray, q: float) -> float:
    """Between-repeat variance of the share below the pooled q-th percentile ÷ its variance were the values
    independent (Woodruff's linearisation, ratio estimator over clusters); at least 1, and 1 for one cluster."""
    _, member = np.unique(clusters, return_inverse=True)
    k, n = int(member.max()) + 1, values.size
    is_below = values <= np.percentile(values, q)
    share = float(np.mean(is_below))
    if k < 2 or share in (0.0, 1.0):
        return 1.0
    sizes = np.bincount(member, minlength=k)
    below = np.bincount(member, weights=is_below.astype(float), minlength=k)
    between = k / (k - 1) * float(np.sum((below - sizes * share) ** 2)) / n**2
    return max(1.0, between / (share * (1 - share) / n))


def quantile_ci(values, q: float, level: float = LEVEL, clusters=None) -> tuple[float, float] | None:
    """Distribution-free interval (x_(l), x_(u)) for the q-th percentile from order statistics, or None when
    too few values for that percentile at that level.

    With `clusters` (one label per value: the repeat it came from), values within a repeat are not taken as
    independent: the binomial ranks are found for an effective size n ÷ deff (`design_effect`: how much more
    the repeats disagree about the share below the estimate than independent values would), then scaled back
    to ranks of the pooled values, rounding outward. This is Woodruff's interval with a Korn–Graubard
    effective size; deff ≥ 1, so repeats never narrow it, and with one repeat it is the plain interval.
    The design effect is estimated from the repeats given, so with two or three it is itself rough."""
    x = np.asarray(values, dtype="float64")
    keep = np.isfinite(x)
    x = x[keep]
    n = x.size
    if n < 2:
        return None
    deff = 1.0 if clusters is None else design_effect(x, np.asarray(clusters)[keep], q)
    m = n if deff == 1.0 else int(n / deff)
    ranks = order_ranks(m, q, level)
    if ranks is None:
        return None
    lo_rank, up_rank = (ranks[0] * n) // m, -((-ranks[1] * n) // m)  # floor and ceiling: outward
    xs = np.sort(x)
    return float(xs[max(lo_rank, 1) - 1]), float(xs[min(up_rank, n) - 1])


@dataclass(slots=True)
class PairedResult:
    """Relative change of a statistic, a against b, in percent (+ means a is larger), with its interval."""

    estimate: float
    lo: float
    hi: float
    n_pairs: int
    significant: bool  # False when the interval includes 0 (and always with one repeat: see `measured`)
    clusters: int = 1  # repeats the comparison spans
    level: float = LEVEL

    @property
    def measured(self) -> bool:
        """Whether lo and hi are an interval (NaN: one repeat, run-to-run variation not measured)."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)


def _resample_counts(members: list[np.ndarray], n: int, n_boot: int,
                     rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Blocks of resample counts [b, n]: clusters drawn with replacement, then each drawn cluster's values
    drawn with replacement as many times as it has values (two-stage); one cluster: a plain bootstrap."""
    k = len(members)
    block = max(1, _BLOCK_CELLS // max(n, 1))
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        picks = np.ones((b, 1), dtype=np.int64) if k == 1 else rng.multinomial(k, np.full(k, 1 / k), size=b)
        counts = np.zeros((b, n), dtype=np.int64)
        for j, idx in enumerate(members):
            counts[:, idx] = rng.multinomial(picks[:, j] * idx.size, np.full(idx.size, 1 / idx.size))
        yield counts


def _weighted_stat(x: np.ndarray, counts: np.ndarray, q: float | None) -> np.ndarray:
    """Per row of counts [b, n]: the mean (q None) or the q-th percentile (numpy's linear rule) of x repeated
    counts times."""
    total = counts.sum(axis=1)
    if q is None:
        return counts @ x / total
    order = np.argsort(x, kind="stable")
    xs, cum = x[order], np.cumsum(counts[:, order], axis=1)
    h = q / 100 * (total - 1)
    floor = np.floor(h)
    i_lo = (cum <= floor[:, None]).sum(axis=1)  # the resample's floor(h)-th smallest value is xs[i_lo]
    i_hi = np.minimum((cum <= floor[:, None] + 1).sum(axis=1), x.size - 1)
    return xs[i_lo] + (h - floor) * (xs[i_hi] - xs[i_lo])


def statistic(x: np.ndarray, q: float | None) -> float:
    """The mean of the values (q None) or their q-th percentile (numpy's linear method)."""
    return float(np.mean(x)) if q is None else float(np.percentile(x, q))


def _result(estimate: float, replicates: np.ndarray, n: int, clusters: int, level: float) -> PairedResult:
    tail = (1 - level) / 2 * 100  # outward ranks, so a resample whose b statistic was 0 (ratio ±inf) stays one
    lo = np.nanpercentile(replicates, tail, method="lower") * 100
    hi = np.nanpercentile(replicates, 100 - tail, method="higher") * 100
    return PairedResult(estimate * 100, float(lo), float(hi), n, not lo <= 0 <= hi, clusters, level)


def paired_ratio(a, b, q: float | None = 50, level: float = LEVEL, clusters=None, *, n_boot: int = N_BOOT,
                 seed: int = SEED) -> PairedResult | None:
    """Relative change of a's q-th percentile (q None: its mean) against b's, a[i] and b[i] being the same
    request under two strategies: a bootstrap that resamples request ids, the same ids on both sides, so
    what the requests share (size, arrival) cancels; with `clusters` (a repeat label per pair) repeats are
    resampled first, then requests within each (`_resample_counts`). Percentile interval of the resamples.
    None with fewer than 2 pairs both finite, or when b's statistic is not positive."""
    a, b = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: {a.size} and {b.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 2 or not statistic(b, q) > 0:
        return None
    members = [np.arange(a.size)]  # each repeat's pairs (one repeat: all)
    if clusters is not None:
        _, member = np.unique(np.asarray(clusters)[keep], return_inverse=True)
        members = [np.flatnonzero(member == j) for j in range(int(member.max()) + 1)]
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = [_weighted_stat(a, c, q) / _weighted_stat(b, c, q) - 1
                for c in _resample_counts(members, a.size, n_boot, rng)]
    return _result(statistic(a, q) / statistic(b, q) - 1, np.concatenate(reps), a.size, len(members), level)


def unpaired_ratio(a, b, q: float | None = 50, level: float = LEVEL, *, n_boot: int = N_BOOT,
                   seed: int = SEED) -> PairedResult | None:
    """As paired_ratio for samples with no common ids: a and b resampled independently (n_pairs: the smaller)."""
    a, b = (np.asarray(s, dtype="float64") for s in (a, b))
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if min(a.size, b.size) < 2 or not statistic(b, q) > 0:
        return None
    rng = np.random.default_rng(seed)
    draws = zip(_resample_counts([np.arange(a.size)], a.size, n_boot, rng),
                _resample_counts([np.arange(b.size)], b.size, n_boot, rng))
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = [_weighted_stat(a, ca, q) / _weighted_stat(b, cb, q) - 1 for ca, cb in draws]
    return _result(statistic(a, q) / statistic(b, q) - 1, np.concatenate(reps), min(a.size, b.size), 1, level)


def _t_within(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with df degrees of freedom (Abramowitz & Stegun 26.7.3–4: exact for integer
    df, a finite sum in cos² of θ = atan(t / √df))."""
    theta = math.atan(t / math.sqrt(df))
    c2, sum_, term = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2 == 0:
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            sum_ += term
        return math.sin(theta) * sum_
    if df == 1:
        return 2 * theta / math.pi
    for k in range(1, (df - 1) // 2):
        term *= 2 * k / (2 * k + 1) * c2
        sum_ += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * sum_)


@lru_cache(maxsize=256)
def t_quantile(level: float, df: int) -> float:
    """t with P(|T| ≤ t) = level, T ~ Student's t on df degrees of freedom (12.71 for 95% and df 1)."""
    lo, hi = 0.0, 1.0
    while _t_within(hi, df) < level:
        hi *= 2
    for _ in range(100):  # bisection: far below float resolution of any t used here
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_within(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def mean_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """(mean, half-width of its t-interval) of independent values (half-width inf with fewer than 2)."""
    values = np.asarray(values, dtype="float64")
    if values.size < 2:
        return (float(values.mean()) if values.size else math.nan), math.inf
    half = t_quantile(level, values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return float(values.mean()), half


def pooled_half_widths(groups: dict[str, list[float]], level: float = LEVEL,
                       new: bool = False) -> tuple[dict[str, float], int]:
    """(each group's half-width of its mean's t-interval with the standard deviation pooled over every group (the
    within-group mean square of a one-way analysis of variance, on Σ(n - 1) degrees of freedom): for samples of one
    noise, such as how fast one machine ran in each of several strategies' interleaved runs, where a group's own
    three or four values would put its t factor at 3.2-4.3, and the pooled degrees of freedom). With `new`, the
    half-width of the interval that one more value of the group falls in (its prediction interval, t·s·√(1 + 1/n)),
    not its mean's (t·s/√n). A group needs 1 value here (inf with no pooled degree of freedom at all)."""
    arrays = {k: np.asarray(v, dtype="float64") for k, v in groups.items()}
    df = sum(a.size - 1 for a in arrays.values() if a.size)
    if df < 1:
        return {k: math.inf for k in arrays}, max(df, 0)
    sd = math.sqrt(sum(float(((a - a.mean()) ** 2).sum()) for a in arrays.values() if a.size) / df)
    t = t_quantile(level, df)
    return {k: (t * sd * (math.sqrt(1 + 1 / a.size) if new else 1 / math.sqrt(a.size)) if a.size else math.inf)
            for k, a in arrays.items()}, df


def log_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(geometric mean, lo, hi) of positive values with a t-interval on their logs: a rate's interval never
    reaches zero, and its width is relative (a 2× swing between runs reads the same at 1 and at 100 req/s).
    With fewer than two values: (the value, 0, inf); NaN for none."""
    x = np.asarray(values, dtype="float64")
    x = x[np.isfinite(x) & (x > 0)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean, half = mean_interval(np.log(x), level)
    if not math.isfinite(half):
        return math.exp(mean), 0.0, math.inf
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def between_repeats(ratios, level: float = LEVEL, n_pairs: int = 0) -> PairedResult | None:
    """Relative change from per-repeat ratios a_r ÷ b_r (each repeat's own paired effect, one unit each, so
    whatever moves a whole run, the machine's speed in that minute or a burst, is in the spread): estimate
    exp(mean log ratio) − 1, interval from Student's t on the log ratios (k − 1 degrees of freedom). With one
    repeat the estimate has no interval (lo, hi NaN) and is never significant: run-to-run variation was not
    measured. None when no ratio is finite and positive. `n_pairs`: the requests behind the ratios (0: none)."""
    x = np.asarray(ratios, dtype="float64")
    logs = np.log(x[np.isfinite(x) & (x > 0)])
    k = logs.size
    if k == 0:
        return None
    mean, half = mean_interval(logs, level)
    if k == 1:
        return PairedResult(math.expm1(mean) * 100, math.nan, math.nan, n_pairs, False, 1, level)
    lo, hi = math.expm1(mean - half) * 100, math.expm1(mean + half) * 100
    return PairedResult(math.expm1(mean) * 100, lo, hi, n_pairs, not lo <= 0 <= hi, k, level)


def _signed(pct: float, decimals: int) -> str:
    text = f"{abs(pct):.{decimals}f}%"
    return ("−" if pct < 0 and float(text[:-1]) != 0 else "+") + text


def pct_text(result: PairedResult) -> str:
    """'−48% [−55%, −40%]', with as many decimals as the interval's width deserves; one repeat: the estimate
    and 'run-to-run variation not measured'."""
    if not result.measured:
        return f"{_signed(result.estimate, 1)} ({UNMEASURED})"
    width = result.hi - result.lo
    decimals = 0 if width >= 10 else 1 if width >= 1 else 2
    est, lo, hi = (_signed(v, decimals) for v in (result.estimate, result.lo, result.hi))
    return f"{est} [{lo}, {hi}]"


def describe(result: PairedResult | None, what: str = "TTFT p50") -> str:
    """'TTFT p50 −48% [−55%, −40%]', or 'no significant difference in TTFT p50 (−2.0% [−9.0%, +5.0%])'."""
    if result is None:
        return f"too few requests finished by both to compare {what}"
    if result.significant or not result.measured:
        return f"{what} {pct_text(result)}"
    return f"no significant difference in {what} ({pct_text(result)})"
