"""REPORT.md's "vs oracle" section: each strategy's mean and p99 E2E and goodput against `sjf` with the
oracle predictor (it knows every request's output length) on the same schedule, one table per rate."""
from dataclasses import dataclass

from batchlab.report.points import Collection
from batchlab.report.stats import GroupStats
from batchlab.report.text import md_table

ORACLE_STRATEGY = "sjf"
ORACLE_PREDICTOR = "oracle"  # sjf's default predictor: a run without one used it
FAILED = "failed"


@dataclass(slots=True)
class OracleRow:
    """One strategy at one rate, beside the oracle's figures there."""

    label: str
    stats: GroupStats | None  # None when no repeat completed
    failed: str  # '' when every repeat completed, else why this point counts as failed
    seeds: frozenset  # the completed repeats' seeds: the same seeds replay the same schedule


def is_oracle(settings: dict) -> bool:
    """A run's (or sweep entry's) settings are sjf with the oracle predictor (missing predictor = oracle)."""
    args = settings.get("strategy_args")
    args = args if isinstance(args, dict) else {}
    return settings.get("strategy") == ORACLE_STRATEGY and args.get("predictor", ORACLE_PREDICTOR) == ORACLE_PREDICTOR


def oracle_label(collection: Collection) -> str | None:
    """The first label (grid order) that is the oracle, by its runs' settings, else by its sweep entry
    (when every point of it failed); None when the collection holds none."""
    settings_of: dict[str, dict] = {}
    for run in collection.runs:
        settings_of.setdefault(run.label, run.settings)
    base = collection.index.get("base") or {}
    for entry in collection.index.get("entries", []):
        settings_of.setdefault(entry.get("label"), {**base, **entry})
    return next((lb for lb in collection.labels() if is_oracle(settings_of.get(lb, {}))), None)


def oracle_row(collection: Collection, stats: dict[tuple[str, float], GroupStats], label: str,
               rate: float) -> OracleRow | None:
    """The label's row at `rate`; None when it has no point there at all."""
    runs = collection.group(label, rate)
    fails = [f for f in collection.failed if f.label == label and f.rate == rate]
    if not runs and not fails:
        return None
    why = (f"{FAILED}: {len(fails)} of {len(fails) + len(runs)} repeat(s); {fails[0].reason.splitlines()[0]}"
           if fails else "")
    return OracleRow(label, stats.get((label, rate)), why, frozenset(r.settings.get("seed") for r in runs))


def ratio(value: float | None, reference: float | None) -> float | None:
    """value ÷ reference; None when either is missing or the reference is not positive."""
    if value is None or reference is None or value != value or not reference > 0:
        return None
    return value / reference


def figures(g: GroupStats, with_goodput: bool) -> list[float | None]:
    """Mean E2E (s), p99 E2E (s) and, with SLOs, goodput (share)."""
    return [g.latency["e2e"]["mean"], g.latency["e2e"]["p99"], *([g.goodput] if with_goodput else [])]


def _value(value: float | None, is_share: bool) -> str:
    if value is None or value != value:
        return "—"
    return f"{value:.1%}" if is_share else f"{value * 1e3:.1f}"


def _cells(row: OracleRow, oracle: OracleRow | None, with_goodput: bool) -> list[str]:
    """The metric cells: value and ratio to the oracle, or 'failed' for a failed point."""
    n = 3 if with_goodput else 2
    if row.failed or row.stats is None:
        return [FAILED] * n
    mine = figures(row.stats, with_goodput)
    if oracle is not None and row.label == oracle.label:
        return [f"{_value(v, i == 2)} (oracle)" for i, v in enumerate(mine)]
    comparable = oracle is not None and not oracle.failed and oracle.stats is not None and row.seeds == oracle.seeds
    theirs = figures(oracle.stats, with_goodput) if comparable else [None] * n
    out = []
    for i, (v, ref) in enumerate(zip(mine, theirs)):
        r = ratio(v, ref)
        out.append(_value(v, i == 2) + (f" ({r:.2f}× oracle)" if r is not None else ""))
    return out


def rate_table(rows: list[OracleRow], oracle: OracleRow | None, with_goodput: bool) -> list[str]:
    """One row per strategy at one rate: failed requests, then each figure with its ratio."""
    head = ["strategy", "failed", "E2E mean ms", "E2E p99 ms", *(["goodput"] if with_goodput else [])]
    return md_table(head, [[row.label, _failed_cell(row), *_cells(row, oracle, with_goodput)] for row in rows])


def _failed_cell(row: OracleRow) -> str:
    failed = row.failed or (row.stats.failed_text() if row.stats is not None else FAILED)
    return failed.replace("|", "\\|")


def _caveat(oracle: OracleRow | None, label: str) -> list[str]:
    """Why a rate's table has no ratios ([] when it has them)."""
    if oracle is None:
        return [f"The oracle ({label}) did not run at this rate: no ratios.", ""]
    if oracle.failed or oracle.stats is None:
        return [f"The oracle ({label}) failed at this rate: no ratios.", ""]
    return []


def section(collection: Collection, stats: dict[tuple[str, float], GroupStats], slos: dict | None) -> list[str]:
    """The "vs oracle" section's lines; [] when the collection holds no oracle entry."""
    label = oracle_label(collection)
    if label is None:
        return []
    out = ["", "## Against the oracle", "",
           f"Each strategy against `{label}` ({ORACLE_STRATEGY} with the {ORACLE_PREDICTOR} predictor: it knows "
           "every request's output length) at the same rate, on the same schedule (the same seeds). E2E in ms "
           "over finished requests (mean, p99); a ratio above 1 is slower" +
           (", and for goodput (SLOs as above) more requests meeting them" if slos else "") +
           ". A point that failed shows as failed, never as a ratio; failed requests (failed / scheduled) go "
           "beside the latencies, as above. A strategy on other seeds than the oracle gets no ratio."]
    for rate in collection.rates():
        rows = [r for lb in collection.labels() if (r := oracle_row(collection, stats, lb, rate)) is not None]
        oracle = next((r for r in rows if r.label == label), None)
        out += ["", f"### λ = {rate:g} req/s", "", *_caveat(oracle, label)]
        out += rate_table(rows, oracle, bool(slos))
    return out
