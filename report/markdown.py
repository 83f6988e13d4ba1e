"""REPORT.md: the one-line results, a table per rate, intervals, tool formulas, failures and setup."""
from batchlab.protocol.outcomes import RunOutcome
from batchlab.report import machine, oracle
from batchlab.report.capacities import capacity_table, criterion_text
from batchlab.report.headline import RULE
from batchlab.report.points import Collection, RunData, index_load, load_text
from batchlab.report.setup import knob_table, prefix_cache_line, schedule_lines, setup_lines
from batchlab.report.stats import CI_LEVEL, CI_METRICS, CI_QUANTILES, FAILED_MARK_SHARE, GroupStats
from batchlab.report.text import figure, md_table, ms
from batchlab.stats.intervals import min_requests

QS = ("p50", "p90", "p99")


ORDERS = {"interleaved": "points in the plan's order (repeat → rate → strategy, each strategy's workers kept warm): "
                          "the strategies at a rate ran back to back",
          "grouped": "points grouped by worker settings: the strategies at a rate ran minutes apart"}


def _pcts(latency: dict) -> str:
    return " / ".join(ms(latency[q]) for q in QS)


def _bytes(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n else "—"


# what each backend's peak_memory_bytes measures (its summary's memory_kind): not one quantity
MEMORY_KINDS = {"cpu_peak_rss": "CPU peak RSS", "cuda_max_allocated": "CUDA peak allocated",
                "vllm_kv_pool": "KV pool in use", "none": "not measured"}
MEMORY_NOTE = ("Peak memory is what each backend measures, named in its cell: HF's is the process's peak RSS "
               "(CPU) or CUDA's peak allocation, weights and activations included; vLLM's is its KV cache pool "
               "in use at the peak, beside the pool's reserved size, weights not included. Compare vLLM's KV "
               "cache use with HF's peak allocation as such, not as one quantity.")


def memory_facts(runs: list[RunData]) -> dict[tuple[str, float], tuple[str, int]]:
    """(strategy, rate) → (what its peak memory measures, the KV pool's size in bytes, 0 without one)."""
    kinds: dict[tuple[str, float], set] = {}
    pools: dict[tuple[str, float], int] = {}
    for run in runs:
        key = (run.label, run.rate)
        kinds.setdefault(key, set()).update(str(getattr(run.summary, "memory_kind", "") or "").split(","))
        sizes = [s.get("kv_pool_bytes") or 0 for s in run.summary.worker_stats.values() if isinstance(s, dict)]
        pools[key] = max([pools.get(key, 0), *sizes])
    return {k: (",".join(sorted(v - {""})), pools[k]) for k, v in kinds.items()}


def _memory(g: GroupStats, facts: tuple[str, int]) -> str:
    """The peak memory cell with what it measures: 'N MiB (CPU peak RSS)', 'N MiB of M MiB KV pool'."""
    kind, pool = facts
    if kind == "vllm_kv_pool" and pool:
        return f"{_bytes(g.peak_memory_bytes)} of {_bytes(pool)} KV pool"
    names = [MEMORY_KINDS.get(k, k) for k in kind.split(",") if k]
    if not g.peak_memory_bytes:
        return f"— ({', '.join(names)})" if names else "—"
    return f"{_bytes(g.peak_memory_bytes)} ({', '.join(names) or 'unknown kind'})"


def rate_table(groups: list[GroupStats], with_goodput: bool, memory: dict | None = None,
               beside: dict | None = None) -> list[str]:
    """One row per strategy at one rate; latencies in ms as p50 / p90 / p99; `memory`: memory_facts();
    `beside`: (strategy, rate) → the other work beside its runs (report.machine.cell)."""
    head = ["strategy", "repeats", "throughput (tok/s)", "requests/s", "TTFT ms", "TPOT ms", "ITL ms",
            "E2E ms", "failed", *(["goodput"] if with_goodput else []), "peak memory",
            "mean useful_fraction", "other work (cores)"]
    return md_table(head, [[g.label, str(g.repeats), f"{g.throughput_tok_s:.1f}", f"{g.requests_per_s:.2f}",
                            *(_pcts(g.latency[m]) for m in ("ttft", "tpot", "itl", "e2e")), g.failed_text(),
                            *([figure(g.goodput, ".1%", "—")] if with_goodput else []),
                            _memory(g, (memory or {}).get((g.label, g.rate), ("", 0))),
                            figure(g.useful_fraction, ".2f", "—"),
                            (beside or {}).get((g.label, g.rate), "—")] for g in groups])


def _point_cells(g: GroupStats) -> list[str]:
    """A row's first cells: strategy, rate and failed requests."""
    return [g.label, f"{g.rate:g}", g.failed_text()]


def _ci_cell(g: GroupStats, key: str) -> str:
    metric, q = key.split("_")
    if g.ci.get(key):
        return f"{ms(g.ci[key][0])} – {ms(g.ci[key][1])}"
    return "—" if g.latency[metric]["p50"] is None else f"too few requests for {q}"


def ci_table(groups: list[GroupStats]) -> list[str]:
    """95% order-statistic intervals of TTFT and E2E p50 / p99 (ms), or where too few requests finished."""
    keys = tuple(f"{m}_p{q}" for m in CI_METRICS for q in CI_QUANTILES)
    return md_table(["strategy", "λ", "failed", *(k.replace("_", " ").upper() for k in keys)],
                    [[*_point_cells(g), *(_ci_cell(g, k) for k in keys)] for g in groups])


def ci_section(groups: list[GroupStats]) -> list[str]:
    """The intervals' heading, how they are made, and the table."""
    needs = ", ".join(f"p{q} ≥ {min_requests(q, CI_LEVEL)}" for q in CI_QUANTILES)
    return ["", "## Confidence intervals", "",
            f"{CI_LEVEL:.0%} distribution-free intervals from order statistics over the finished requests, in ms "
            "(docs/statistics.md). Such an interval exists only with enough requests "
            f"({needs} when repeats agree; more when they disagree, each repeat counting as a cluster): "
            "below that the table says too few requests instead of an interval the data cannot support.",
            ""] + ci_table(groups)


def tools_table(groups: list[GroupStats]) -> list[str]:
    """TPOT / ITL by each tool's formula: mean / median / p99 (ms)."""
    names = list(groups[0].tools) if groups else []
    return md_table(["strategy", "λ", "failed", *names],
                    [[*_point_cells(g), *(" / ".join(ms(g.tools[n][k]) for k in ("mean", "p50", "p99"))
                                          for n in names)] for g in groups])


def joins_table(groups: list[GroupStats]) -> list[str]:
    """TPOT with and without the steps that carried other requests' prompt tokens (continuous batches)."""
    head = ["strategy", "λ", "failed", "TPOT p50", "TPOT p50 over decode-only gaps",
            "gaps ending in a step with prompt tokens", "mean gap there / elsewhere"]
    return md_table(head, [[*_point_cells(g), ms(g.latency["tpot"]["p50"]), ms(g.joins["decode_only_tpot"]["p50"]),
                            f"{g.joins['chunk_share']:.1%}",
                            f"{ms(g.joins['chunk_gap_mean'])} / {ms(g.joins['plain_gap_mean'])}"] for g in groups])


CLOSED_LOOP_CAVEAT = (
    "Closed-loop load: each run's load is its concurrency (clients), not an arrival rate, and the tables below "
    "are per concurrency (clients). In closed loop a client sends only when its last request ended, so latency "
    "is measured from when a client could send: it hides the queueing that an open-loop arrival would see "
    "(coordinated omission). Throughput is the measured figure. Capacity comparisons need an open-loop sweep "
    "(grid.rates): none is computed here.")


def render(collection: Collection, stats: dict[tuple[str, float], GroupStats], headlines: list[str],
           plots: list[str], chosen_rate: float | None, slos: dict | None, capacities: dict | None = None,
           capacity_source: str = "", twin_lines: list[str] | None = None) -> str:
    """The whole REPORT.md text: the capacity table, then the headline, then the curves and the details."""
    groups = list(stats.values())
    out = [f"# batchlab report: {collection.root}", "", "## Capacity", ""]
    if collection.closed_loop:
        out += [CLOSED_LOOP_CAVEAT]
    else:
        out += (capacity_table(capacities) + ["", criterion_text(capacity_source)]) if capacities else [
            "Capacity was not measured: no run to judge."]
    out += twin_lines or []
    out += ["", "## Result", ""]
    none = ("- No capacity headline in closed loop: compare strategies' capacity with an open-loop sweep."
            if collection.closed_loop else "- No naive run to compare the other strategies with.")
    out += [f"- {h}" for h in headlines] or [none]
    if busy := machine.warning(collection, capacities or {}):
        out += ["", busy]
    if headlines:
        out += ["", f"By a fixed rule: {RULE}. Latency changes are paired over the same requests (every strategy "
                "replays the same schedule); each repeat gives one ratio, so the interval holds what moves a "
                "whole run (the machine's speed, a burst), and with one repeat no interval is claimed. An "
                "interval that includes zero is written as no significant difference."]
    out += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    out += ["", "Latency plots cover finished requests only: each curve point is labelled with its failed "
            f"share, a red x marks points where more than {FAILED_MARK_SHARE:.0%} failed, and each "
            "distribution's legend gives failed / scheduled."]
    if chosen_rate is not None:
        out += ["", f"CDFs, ITL histogram, timeline and load plots are at λ = {chosen_rate:g} req/s."]
    slo_text = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in (slos or {}).items())
    out += ["", "## Results per rate", "",
            "Latencies in ms as p50 / p90 / p99 over the finished requests of every repeat, so the failed "
            "column (failed / scheduled) belongs beside them: a strategy that drops more looks faster. "
            "Throughput is the mean over repeats; other work is the most CPU other processes took beside one of "
            "the point's runs (⚠: more than the threshold; section The machine while it ran)." + (f" Goodput: share of submitted requests meeting {slo_text} "
                                        "(failed requests are misses)." if slos else ""), "", MEMORY_NOTE]
    memory = memory_facts(collection.runs)
    beside = {(g.label, g.rate): machine.cell(machine.of_runs(collection.group(g.label, g.rate))) for g in groups}
    for rate in collection.rates():
        out += ["", f"### {load_text(rate, collection.closed_loop)}", ""]
        out += rate_table([g for g in groups if g.rate == rate], bool(slos), memory, beside)
    out += oracle.section(collection, stats, slos)
    out += ci_section(groups)
    out += ["", "## TPOT and ITL by other tools' formulas", "",
            "mean / median / p99 in ms, as each tool's source computes them (docs/load-and-results.md). vLLM's "
            "TPOT and AIPerf's ITL are one per-request figure, (E2E − TTFT) ÷ (out − 1), with numpy's "
            "percentiles over requests; vLLM's ITL pools every gap (long requests weigh more); GuideLLM's ITL is "
            "the same per-request figure weighted by its out − 1 tokens (its mean is all decode time ÷ all decode "
            "tokens, its percentiles the smallest value whose weighted CDF reaches p).", ""] + tools_table(groups)
    joined = [g for g in groups if g.joins]
    if joined:
        out += ["", "## Joiners' prefill in continuous TPOT", "",
                "A static batch prefills before its first token, so its TPOT holds decode steps only; a continuous "
                "batch prefills each joiner inside the running rows' steps, so their TPOT holds it too. Each "
                "finished request's inter-token gaps, split by whether the step that produced the later token "
                "carried prompt tokens (steps.parquet), in ms (measured, not modelled).", ""] + joins_table(joined)
    out += machine.section(collection, capacities or {}) + failures(collection) + setup(collection)
    return "\n".join(out) + "\n"


def failures(collection: Collection) -> list[str]:
    """Points that did not complete, with their reasons."""
    listed = {(f.label, f.rate, f.repeat) for f in collection.failed}  # a stopped point that measured nothing
    stopped = [p for p in collection.index.get("points", []) if p["status"] != RunOutcome.FAILED and p.get("reason")
               and (p["label"], index_load(p), p["repeat"]) not in listed]
    if not collection.failed and not stopped:
        return []
    lines, closed = ["", "## Failed and stopped points", ""], collection.closed_loop
    for f in collection.failed:
        lines.append(f"- {f.label} {load_text(f.rate, closed, '')} rep {f.repeat}: failed: {f.reason.splitlines()[0]}")
    for p in stopped:  # kept: what finished counts, the rest are failed requests
        lines.append(f"- {p['label']} {load_text(index_load(p), closed, '')} rep {p['repeat']}: {p['reason']}")
    return lines


def setup(collection: Collection) -> list[str]:
    """Hardware, model, libraries and every knob per strategy."""
    first = {}
    for run in collection.runs:
        first.setdefault(run.label, run)
    if not first:
        return []
    lines = ["", "## Setup", ""] + setup_lines(next(iter(first.values())))
    lines += [line for run in first.values() if (line := prefix_cache_line(run))]
    lines += schedule_lines(collection.runs)
    index = collection.index
    if index:
        own = " (0: a trace's own timing)" if 0 in (index.get("rates") or []) else ""
        lines.append(f"- sweep: rates {index.get('rates')} req/s{own}, {index.get('repeats')} repeat(s), "
                     f"traffic seed = {index.get('seed')} + repeat (every strategy replays the same schedule)"
                     + (f"; {ORDERS[index['order']]}" if index.get("order") in ORDERS else ""))
        if index.get("capacity"):
            lines.append("- rates placed from every strategy's searched capacity (log-spaced from well below the "
                         "lowest to above the highest; capacity.json holds each probe and its verdict)")
        if index.get("probe"):
            p = index["probe"]
            lines.append(f"- rates placed from a capacity probe on {p['label']}: {p['capacity_req_s']:.3g} req/s "
                         f"({p['requests']} requests in {p['window_s']:.1f} s, saturated: {p['saturated']})")
    return lines + ["", "### Settings", ""] + knob_table(first)
