"""Numbers per (strategy, rate) over its repeats: stats.metrics formulas, order-statistic intervals,
goodput, the TPOT / ITL formulas other benchmarking tools use, and paired comparisons with repeats as units.

How much of a continuous batch's TPOT is other requests' prefill (split, at the end): a static batch
prefills once, before its first token, so its requests' TPOT holds decode steps only. In a continuous batch
a request that joins is prefilled inside the running rows' steps (whole, or in chunks within the step's token
budget), so the running rows' TPOT also holds the joiners' prefill: on a device where a step costs what its
tokens cost (a CPU), that is the price of the joiner's early first token, not slowness per token. split
divides each finished request's inter-token gaps by the step that produced the later token: one that
carried prompt tokens (`steps.parquet` prefill_tokens > 0) or one that decoded only. Measured, not
modelled: no step time is estimated. Runs whose steps record no prompt tokens (static batches; the vLLM
backend, whose steps do not report them) give None.
"""
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchlab.report.points import RunData
from batchlab.report.tokens import CARRIED, PLAIN, TokenDigest, starts_of
from batchlab.protocol.status import RequestStatus
from batchlab.stats.intervals import PairedResult, between_repeats, quantile_ci, statistic
from batchlab.stats.metrics import LATENCY_STATS, goodput, percentiles, request_metrics
from batchlab.stats.quantiles import chunked_percentiles

CI_LEVEL = 0.95
CI_METRICS = ("ttft", "e2e")  # request-level latencies that get percentile intervals
CI_QUANTILES = (50, 99)
PANELS = (("ttft", "p50"), ("ttft", "p99"), ("e2e", "p50"), ("e2e", "p99"))  # the latency curves' (plots, html)
FAILED_MARK_SHARE = 0.01  # above this failed share a latency figure flags the point: it flatters


@dataclass(slots=True)
class GroupStats:
    """One strategy at one rate, its repeats pooled (latencies in s)."""

    label: str
    rate: float
    repeats: int
    throughput_tok_s: float  # mean over repeats
    requests_per_s: float
    scheduled: int
    failed: int
    latency: dict  # metric -> {mean, p50, p90, p99}
    ci: dict  # "ttft_p50" -> (lo, hi), None when too few requests for that percentile (intervals.quantile_ci)
    peak_memory_bytes: int
    useful_fraction: float
    goodput: float | None
    tools: dict = field(default_factory=dict)  # tool formula -> {mean, p50, p99} (s)
    joins: dict | None = None  # split: joiners' prefill in TPOT (None: no step had any)

    @property
    def failed_share(self) -> float:
        """Failed ÷ scheduled over the repeats (0 when nothing was scheduled)."""
        return self.failed / self.scheduled if self.scheduled else 0.0

    def failed_text(self) -> str:
        """'50 / 234 (21%)': latencies cover finished requests only, so this goes beside every one."""
        return f"{self.failed} / {self.scheduled} ({share_text(self.failed_share)})"


def share_text(share: float) -> str:
    """A share as a percent, with a decimal near 0% and 100% so a few failures never read as none (or all)."""
    return f"{share:.1%}" if 0 < share < 0.01 or 0.99 < share < 1 else f"{share:.0%}"


def finished_requests(run: RunData) -> pd.DataFrame:
    """The run's finished requests, with their latency columns."""
    df = request_metrics(run.requests)
    return df[df["status"] == RequestStatus.FINISHED]


def percentile_ci(samples: list[np.ndarray], q: float, level: float = CI_LEVEL) -> tuple[float, float] | None:
    """Order-statistic interval of the q-th percentile over the repeats' values, each repeat a cluster."""
    samples = [s for s in samples if s.size]
    if not samples:
        return None
    clusters = np.repeat(np.arange(len(samples)), [s.size for s in samples])
    return quantile_ci(np.concatenate(samples), q, level, clusters=clusters)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray) -> dict:
    """GuideLLM's statistics of weighted values (`schemas/base/statistics.py`): the weighted mean, and as the
    q-th percentile the smallest value whose weighted CDF reaches q (`Percentiles.from_pdf`); None each
    without values."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not values.size:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order]) / weights.sum()
    pick = {q: float(values[order][min(np.searchsorted(cdf, q / 100, side="left"), values.size - 1)])
            for q in (50, 90, 99)}
    return {"mean": float(np.sum(values * weights) / weights.sum()), **{f"p{q}": v for q, v in pick.items()}}


TOOL_FORMULAS = {  # each tool's name → its formula, as its source computes it (docs/load-and-results.md)
    "vllm_tpot": "vLLM TPOT: (E2EL − TTFT) ÷ (out − 1) per request",
    "vllm_itl": "vLLM ITL: every gap pooled",
    "guidellm_itl": "GuideLLM ITL: (last − first token) ÷ (out − 1) per request, weighted by out − 1",
    "aiperf_itl": "AIPerf ITL: (request latency − TTFT) ÷ (OSL − 1) per request",
}


def gap_percentiles(digests: list[TokenDigest], request_ids: list | None = None) -> dict:
    """metrics.percentiles of the runs' gaps (of each run's `request_ids`, None: all), a block at a time."""
    return chunked_percentiles(lambda: (gaps for k, d in enumerate(digests)
                                        for gaps in d.itl_chunks(None if request_ids is None else request_ids[k])),
                               LATENCY_STATS)


def tool_formulas(finished: list[pd.DataFrame], digests: list[TokenDigest]) -> dict:
    """TPOT / ITL as vLLM (vllm/benchmarks/serve.py calculate_metrics), GuideLLM (schemas/base/request_stats.py,
    benchmark/schemas/metrics.py) and AIPerf (metrics/types/inter_token_latency_metric.py) compute them, over
    each run's finished requests of more than one token (its digest's tokens)."""
    multis = [f[f["output_len"] > 1] for f in finished]
    multi = pd.concat(multis, ignore_index=True)
    spans, weights = [np.empty(0)], [np.empty(0)]
    for d, m in zip(digests, multis):
        steps = m.set_index("request_id")["output_len"] - 1
        span = (d.spans() / steps).dropna()
        spans.append(span.to_numpy(dtype="float64"))
        weights.append(steps.loc[span.index].to_numpy(dtype="float64"))
    decode = (multi["e2e"] - multi["ttft"]) / (multi["output_len"] - 1)  # latency − TTFT: last − first token
    return {
        TOOL_FORMULAS["vllm_tpot"]: percentiles(decode),
        TOOL_FORMULAS["vllm_itl"]: gap_percentiles(digests, [m["request_id"] for m in multis]),
        TOOL_FORMULAS["guidellm_itl"]: weighted_percentiles(np.concatenate(spans), np.concatenate(weights)),
        TOOL_FORMULAS["aiperf_itl"]: percentiles(decode),
    }


def _peak_memory(runs: list[RunData]) -> int:
    peaks = [r.summary.peak_memory_bytes for r in runs]
    peaks += [int(r.batches["peak_memory_bytes"].max()) for r in runs
              if not r.batches.empty and "peak_memory_bytes" in r.batches]
    return max(peaks, default=0)


def _useful_fraction(runs: list[RunData]) -> float:
    values = [r.batches["useful_fraction"] for r in runs if "useful_fraction" in r.batches]
    pooled = pd.concat(values).dropna() if values else pd.Series(dtype="float64")
    return float(pooled.mean()) if not pooled.empty else float("nan")


def _goodput(runs: list[RunData], slos: dict | None) -> float | None:
    if not slos:
        return None
    parts = [goodput(r.requests, slos) for r in runs]
    submitted = sum(p["submitted"] for p in parts)
    return sum(p["met"] for p in parts) / submitted if submitted else None


def group_stats(runs: list[RunData], slos: dict | None = None) -> GroupStats:
    """Pool the repeats of one strategy at one rate."""
    summaries = [r.summary for r in runs]
    finished = [finished_requests(r) for r in runs]
    pooled = pd.concat(finished, ignore_index=True)
    digests = [r.token_digest() for r in runs]
    latency = {m: gap_percentiles(digests, [f["request_id"] for f in finished]) if m == "itl"
               else percentiles(pooled[m]) for m in ("ttft", "tpot", "itl", "e2e")}
    ci = {f"{m}_p{q}": percentile_ci([f[m].dropna().to_numpy() for f in finished], q)
          for m in CI_METRICS for q in CI_QUANTILES}
    steps = [r.steps for r in runs if not r.steps.empty]
    return GroupStats(
        runs[0].label, runs[0].rate, len(runs),
        float(np.mean([s.throughput_tok_s for s in summaries])), float(np.mean([s.requests_per_s for s in summaries])),
        sum(s.scheduled for s in summaries), sum(s.failed for s in summaries),
        latency, ci, _peak_memory(runs), _useful_fraction(runs), _goodput(runs, slos),
        tool_formulas(finished, digests),
        split(finished, digests, pd.concat(steps, ignore_index=True)) if steps else None)


def all_stats(collection, slos: dict | None = None) -> dict[tuple[str, float], GroupStats]:
    """GroupStats for every (label, rate) with at least one completed repeat."""
    return {(label, rate): group_stats(runs, slos) for label in collection.labels() for rate in collection.rates()
            if (runs := collection.group(label, rate))}


def _pair_key(run: RunData) -> tuple:
    """Runs whose request ids name the same requests: same planned rate, repeat and traffic seed."""
    return run.rate, run.repeat, run.settings.get("seed")


def paired_latency(runs_a: list[RunData], runs_b: list[RunData], metric: str = "ttft", q: float | None = 50,
                   level: float = CI_LEVEL) -> PairedResult | None:
    """a's q-th percentile (q None: mean) of a request latency against b's, in percent. Each repeat is one unit:
    its ratio is taken over the requests both finished in it, paired by (rate, repeat, seed, request id), and
    the interval comes from the spread of those ratios between repeats (intervals.between_repeats; one repeat:
    no interval). None if no repeat pairs."""
    others = {_pair_key(r): r for r in runs_b}
    ratios, n_pairs = [], 0
    for run in runs_a:
        other = others.get(_pair_key(run))
        if other is None:
            continue
        both = finished_requests(run)[["request_id", metric]].merge(
            finished_requests(other)[["request_id", metric]], on="request_id", suffixes=("_a", "_b")).dropna()
        a, b = both[f"{metric}_a"].to_numpy(), both[f"{metric}_b"].to_numpy()
        if both.empty or not statistic(b, q) > 0:
            continue
        ratios.append(statistic(a, q) / statistic(b, q))
        n_pairs += len(both)
    return between_repeats(ratios, level, n_pairs) if ratios else None


def split(finished: list[pd.DataFrame], digests: list[TokenDigest], steps: pd.DataFrame) -> dict | None:
    """For each run's finished requests of more than one token: TPOT over decode-only gaps (per request, then
    percentiles), the share of gaps that ended in a step carrying prompt tokens and both kinds' mean gap (s).
    A gap's step is its later token's (report.tokens.StepFlags); `steps`, the runs' steps, say whether any
    step carried prompt tokens."""
    if (not any("worker" in f for f in finished) or steps.empty or "prefill_tokens" not in steps
            or not (steps["prefill_tokens"] > 0).any()):
        return None
    means = [np.empty(0)]
    n_chunk = n_plain = 0
    chunk_sum = plain_sum = 0.0
    for f, d in zip(finished, digests):
        ids = f.loc[f["output_len"] > 1, "request_id"].to_numpy(dtype="int64")
        for b in d.blocks:  # whole requests a block: the per-request means need no other block
            if b.flags is None:  # the run's steps do not say which carried prompt tokens
                continue
            mine = b.mask(ids)
            chunk, plain = mine & (b.flags == CARRIED), mine & (b.flags == PLAIN)
            n_chunk, n_plain = n_chunk + int(chunk.sum()), n_plain + int(plain.sum())
            chunk_sum += float(b.gaps[chunk].sum())
            plain_sum += float(b.gaps[plain].sum())
            owners = np.repeat(np.arange(len(b.request_ids)), b.gap_counts)[plain]  # ascending
            if owners.size:
                starts = starts_of(owners)
                counts = np.diff(np.append(starts, owners.size))
                means.append(np.add.reduceat(b.gaps[plain], starts) / counts)
    total = n_chunk + n_plain
    if not total:
        return None
    return {"decode_only_tpot": percentiles(np.concatenate(means)),
            "chunk_share": n_chunk / total,
            "chunk_gap_mean": chunk_sum / n_chunk if n_chunk else None,
            "plain_gap_mean": plain_sum / n_plain if n_plain else None}
