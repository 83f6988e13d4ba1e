"""The machine while the runs ran: how much CPU other work took beside them (each run's summary.json
`interference`, a saturated run's in capacity.json), shown beside the figures it can bend, and a warning
when it passed the documented threshold (stats.interference: DISTURBED_CORES)."""
import statistics

from batchlab.report.points import Collection, RunData
from batchlab.stats.interference import DISTURBED_CORES, DISTURBED_STEAL, Interference, read


def of_runs(runs: list[RunData]) -> list[Interference]:
    """The interference each run recorded (runs metered before batchlab recorded it are left out)."""
    return [found for r in runs if (found := read(r.summary.interference)) is not None]


def saturated_of(capacities: dict[str, dict]) -> dict[str, list[Interference]]:
    """Each strategy's saturated runs' interference (capacity.json's runs, where recorded)."""
    return {lb: [found for run in ((c.get("saturated") or {}).get("runs") or [])
                 if (found := read(run.get("interference"))) is not None] for lb, c in capacities.items()}


def cell(found: list[Interference]) -> str:
    """'0.03' or '1.02 ⚠' (the most any of these runs saw, in cores; '—' when none was metered)."""
    if not found:
        return "—"
    worst = max(found, key=lambda f: f.other_cores)
    return f"{worst.other_cores:.2f}" + (" ⚠" if any(f.disturbed for f in found) else "")


def summary_line(found: list[Interference], what: str = "runs") -> str:
    """'other work beside the 24 runs: median 0.04, at most 0.31 of 2 cores; 1 run above 0.25 of a core'."""
    if not found:
        return ""
    other = [f.other_cores for f in found]
    busy = sum(f.disturbed for f in found)
    steal = max(f.steal_share for f in found)
    return (f"other work beside the {len(found)} {what}: median {statistics.median(other):.2f}, at most "
            f"{max(other):.2f} of {found[0].cores} cores" + (f", steal up to {steal:.0%}" if steal >= 0.005 else "")
            + f"; {busy} above {DISTURBED_CORES:g} of a core" + (" ⚠" if busy else ""))


def warning(collection: Collection, capacities: dict[str, dict]) -> str:
    """One ⚠ line when other work disturbed the runs (the grid's or the saturated ones), else ''."""
    found = of_runs(collection.runs) + [f for fs in saturated_of(capacities).values() for f in fs]
    busy = [f for f in found if f.disturbed]
    if not busy:
        return ""
    median = statistics.median(f.other_cores for f in found)
    steady = median > DISTURBED_CORES
    return (f"⚠ The machine was busy: other work took more than {DISTURBED_CORES:g} of a core beside {len(busy)} of "
            f"{len(found)} runs (median {median:.2f} of {found[0].cores} cores). Throughput and latency are bent by "
            "it; " + ("it stayed for the whole sweep, so every strategy saw it, and the paired comparisons "
                      "(strategies alternated within each repeat) keep most of their meaning" if steady else
                      "it came in bursts, so a comparison whose runs it hit may differ from a quiet machine's")
            + ". Run again on a quiet machine for figures to publish.")


def section(collection: Collection, capacities: dict[str, dict]) -> list[str]:
    """REPORT.md's 'The machine while it ran' section: the figures, each saturated strategy's, the reruns."""
    grid = summary_line(of_runs(collection.runs), "grid runs")
    sat = {lb: fs for lb, fs in saturated_of(capacities).items() if fs}
    reran = collection.index.get("reran") or []
    if not grid and not sat:
        return []
    lines = ["", "## The machine while it ran", "",
             "Other work = all the machine's busy CPU time (user, system, irq) less batchlab's own processes' "
             "(the launcher and every process it started), in cores, over each run from its first request to its "
             f"end; steal = time the hypervisor gave to other machines. A run is marked ⚠ above {DISTURBED_CORES:g} "
             f"of a core of other work or {DISTURBED_STEAL:.0%} steal (docs/validation.md, \"A busy machine\").", ""]
    lines += [f"- {grid}"] if grid else []
    lines += [f"- saturated runs (μ) of {lb}: {summary_line(fs, 'runs')}" for lb, fs in sat.items()]
    lines += [f"- ran again for a burst of other work: {r}" for r in reran]
    return lines
