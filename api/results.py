"""What the API's sweep-like jobs return: the folder they wrote and its figures, typed."""
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class SweepResult:
    """A sweep's folder and its index (OUT/sweep.json: the plan, the rates, every point's record)."""

    out: Path
    index: dict

    @property
    def points(self) -> list[dict]:
        """Each point's record: entry label, rate, repeat, folder (`dir`), status done | skipped | failed."""
        return self.index["points"]

    @property
    def measured(self) -> int:
        """Points that measured (done now, or skipped on resume because done before)."""
        return sum(p["status"] != "failed" for p in self.points)

    @property
    def failed(self) -> int:
        """Points whose run failed (their reason in `points` and in the folder's FAILED.txt)."""
        return sum(p["status"] == "failed" for p in self.points)

    def summaries(self) -> dict[tuple[str, float | None, int], object]:
        """(strategy label, rate, repeat) → the point's Summary, for every point that measured (a closed-loop
        point's rate is None)."""
        from batchlab.collector.summary import read_summary

        return {(p["label"], p["rate"], p["repeat"]): read_summary(self.out / p["dir"])
                for p in self.points if p["status"] != "failed"}

    @property
    def capacity(self) -> dict | None:
        """With automatic rates, every strategy's capacity search (capacity.json's content); else None."""
        return self.index.get("capacity")

    def report(self, **options):
        """REPORT.md of this sweep (report.build.run_report's options: rate, slos, out, extra)."""
        from batchlab.report.build import run_report

        return run_report(str(self.out), **options)


@dataclass(slots=True)
class CapacityResult:
    """Each strategy's saturated rate μ and capacity (capacity.json's content) and where it was written."""

    doc: dict
    out: Path | None  # None: searched in virtual time with no folder asked for

    @property
    def strategies(self) -> dict[str, dict]:
        """Label → its search: estimate_req_s, lo_req_s / hi_req_s (the bracket), saturated (μ), probes."""
        return self.doc["strategies"]

    @property
    def estimates(self) -> dict[str, float | None]:
        """Label → capacity estimate (req/s; None when it could not be bracketed)."""
        return {label: c["estimate_req_s"] for label, c in self.strategies.items()}

    @property
    def simulated(self) -> bool:
        """Searched in virtual time (the sim backend's step model), not on live workers."""
        return bool(self.doc.get("simulated"))

    def lines(self) -> list[str]:
        """The capacity table as `batchlab capacity` prints it."""
        from batchlab.report.capacities import capacity_text

        return list(capacity_text(self.strategies))


@dataclass(slots=True)
class SimulationResult:
    """Each simulated point and its Summary, in grid order, and the folder they went to."""

    out: Path
    points: list  # [(Point, Summary)]: Point has entry.label, rate, repeat, folder

    def summaries(self) -> dict[tuple[str, float], object]:
        """(strategy label, rate) → Summary (the first repeat's when several)."""
        found: dict = {}
        for point, summary in self.points:
            found.setdefault((point.entry.label, point.rate), summary)
        return found
