"""What the API's jobs return, typed, and the tables of their runs as pandas DataFrames (or DuckDB queries).

A SweepResult (sweep, simulate, load) holds its folder and a PointRecord per point; requests(), tokens(),
batches() and steps() concatenate the measured points' tables, every row with its run's identity columns
(label, strategy, rate, repeat, config_hash, ...); points() is one row per point with its headline figures;
sql() runs a DuckDB query over views of the same tables (and `points`). CapacityResult and TuneResult type
capacity.json and tune.json; Summary (one run) reads its own tables too (collector.summary).
"""
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from batchlab.protocol.outcomes import MEASURED, RunOutcome
from batchlab.collector.summary import Summary

if TYPE_CHECKING:
    import pandas as pd

    from batchlab.report.build import Report


class PointKey(NamedTuple):
    """A sweep point: its strategy's label, its rate (req/s; None for a closed-loop point, whose load is its
    clients), its repeat and, closed loop, its clients."""

    label: str
    rate: float | None
    repeat: int
    concurrency: int = 0


@dataclass(frozen=True, slots=True)
class PointRecord:
    """One point as its sweep's index records it: what ran, where (`folder`), and how it ended."""

    label: str
    strategy: str
    backend: str
    rate: float | None  # None: closed loop (see concurrency)
    concurrency: int
    repeat: int
    seed: int
    folder: Path
    status: str  # done | skipped (done before, reused) | failed | pending
    reason: str = ""
    elapsed_s: float | None = None

    @property
    def key(self) -> PointKey:
        """The point's key in summaries()."""
        return PointKey(self.label, self.rate, self.repeat, self.concurrency)

    @property
    def measured(self) -> bool:
        """Its run returned and its folder holds what it measured."""
        return self.status in MEASURED

    @classmethod
    def of(cls, out: Path, record: dict) -> "PointRecord":
        """From a sweep.json point (its `dir` relative to the sweep's folder `out`)."""
        rate = record.get("rate")
        return cls(str(record["label"]), str(record.get("strategy") or ""), str(record.get("backend") or ""),
                   None if rate is None else float(rate), int(record.get("concurrency") or 0),
                   int(record.get("repeat") or 0), int(record.get("seed") or 0), Path(out) / str(record["dir"]),
                   str(record.get("status", "")), str(record.get("reason") or ""), record.get("elapsed_s"))


class Runs:
    """The tables of a result's run folders, as DataFrames and through DuckDB."""

    def folders(self) -> list[Path]:
        """The run folders that measured something."""
        raise NotImplementedError

    def requests(self, columns: list[str] | None = None) -> "pd.DataFrame":
        """Every request of every measured run, with its run's identity columns (docs/outputs.md)."""
        return self._table("requests", columns)

    def tokens(self, columns: list[str] | None = None) -> "pd.DataFrame":
        """Every output token of every measured run (join requests on config_hash and request_id)."""
        return self._table("tokens", columns)

    def batches(self, columns: list[str] | None = None) -> "pd.DataFrame":
        """Every batch of every measured run."""
        return self._table("batches", columns)

    def steps(self, columns: list[str] | None = None) -> "pd.DataFrame":
        """Every continuous-mode engine step of every measured run."""
        return self._table("steps", columns)

    def points(self) -> "pd.DataFrame":
        """One row per run."""
        raise NotImplementedError

    def duckdb(self):
        """A DuckDB connection with views requests, tokens, batches, steps (the measured runs' files) and points."""
        from batchlab.collector.reading import connect

        con = connect(self.folders())
        con.register("points", self.points())
        return con

    def sql(self, query: str) -> "pd.DataFrame":
        """A DuckDB query over the views of duckdb(), as a DataFrame."""
        con = self.duckdb()
        try:
            return con.sql(query).df()
        finally:
            con.close()

    def _table(self, name: str, columns: list[str] | None) -> "pd.DataFrame":
        from batchlab.collector.reading import read_table

        return read_table(self.folders(), name, columns)


class RunResult(Summary, Runs):
    """One run's Summary (its figures and settings, summary.json typed) with its folder's tables."""

    @classmethod
    def of(cls, summary: Summary) -> "RunResult":
        """The summary read (or returned by a run), with its folder."""
        result = cls.model_validate(summary.model_dump())
        result._folder = summary.folder
        return result

    def folders(self) -> list[Path]:
        """Its one folder."""
        return [self.folder]

    def points(self) -> "pd.DataFrame":
        """One row: its label, strategy, backend, rate, concurrency, repeat, seed, folder and its figures."""
        import pandas as pd

        s = self.settings
        row = {k: s.get(k) for k in ("label", "strategy", "backend", "rate", "concurrency", "repeat", "seed")}
        return pd.DataFrame([row | {"folder": str(self.folder)} | self.figures()])


@dataclass(slots=True)
class SweepResult(Runs):
    """A sweep's folder, a record per point and, with automatic rates, every strategy's capacity."""

    out: Path
    records: list[PointRecord]
    capacity: "CapacityResult | None" = None
    index: dict = field(default_factory=dict)  # sweep.json as written ({} for a lone run's folder)

    @classmethod
    def of(cls, out: str | Path, index: dict) -> "SweepResult":
        """From a sweep's index (sweep.json's content)."""
        capacity = index.get("capacity")
        return cls(Path(out), [PointRecord.of(Path(out), p) for p in index.get("points", [])],
                   None if not capacity else CapacityResult.of(capacity, None), index)

    @property
    def measured(self) -> int:
        """Points that measured (done now, or skipped on resume because done before)."""
        return sum(r.measured for r in self.records)

    @property
    def failed(self) -> int:
        """Points whose run failed (their reason in `records` and in the folder's FAILED.txt)."""
        return sum(r.status == RunOutcome.FAILED for r in self.records)

    def folders(self) -> list[Path]:
        """The measured points' run folders, in the sweep's order."""
        return [r.folder for r in self.records if r.measured]

    def summaries(self) -> dict[PointKey, RunResult]:
        """Each measured point's Summary (with its tables), by its key (every repeat its own)."""
        from batchlab.collector.summary import read_summary

        return {r.key: RunResult.of(read_summary(r.folder)) for r in self.records if r.measured}

    def points(self) -> "pd.DataFrame":
        """One row per point: what ran (label, strategy, backend, rate, concurrency, repeat, seed), how it ended
        (status, reason, elapsed_s, folder) and, measured, its headline figures (Summary.figures)."""
        import pandas as pd

        from batchlab.collector.summary import read_summary

        rows = []
        for r in self.records:
            row = {k: v for k, v in asdict(r).items()}
            row["folder"] = str(r.folder)
            rows.append(row | (read_summary(r.folder).figures() if r.measured else {}))
        df = pd.DataFrame(rows)
        if "rate" in df:
            df["rate"] = df["rate"].astype("float64")  # None (closed loop) → NaN
        return df

    def report(self, *, rate: float | None = None, slos: object = None, out: str | Path | None = None,
               extra: list[str] | None = None) -> "Report":
        """REPORT.md, REPORT.html and the plots of this sweep (api.report's options: rate, slos, out, extra)."""
        from batchlab.report.build import checked_slos, run_report

        return run_report(str(self.out), rate=rate, slos=checked_slos(slos), out=None if out is None else str(out),
                          extra=extra)


@dataclass(slots=True)
class SimulationResult(SweepResult):
    """A grid simulated in virtual time, written as a sweep's folder (a single point: OUT is its run)."""


@dataclass(frozen=True, slots=True)
class CapacityProbe:
    """One rate a capacity search ran (nominal, and what its arrivals offered), and whether it was sustained."""

    rate_req_s: float  # the nominal rate asked for (the schedule's λ)
    sustained: bool
    folder: str = ""  # relative to the search's folder ("" in virtual time)
    reason: str = ""
    offered_req_s: float | None = None  # arrivals ÷ duration, the rate the verdict judged (None: not recorded)


def _rate(value: object) -> float | None:
    """A probe's recorded rate as a float (None: absent)."""
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class StrategyCapacity:
    """One strategy's capacity: the estimate and its interval (req/s, and output tok/s), μ (its saturated rate)
    with its interval, the probes, and a note when there is no bracket."""

    label: str
    estimate_req_s: float | None
    lo_req_s: float | None
    hi_req_s: float | None
    estimate_tok_s: float | None
    lo_tok_s: float | None
    hi_tok_s: float | None
    saturated_req_s: float | None  # μ
    saturated_lo_req_s: float | None
    saturated_hi_req_s: float | None
    probes: list[CapacityProbe]
    note: str = ""

    @classmethod
    def of(cls, label: str, entry: dict) -> "StrategyCapacity":
        """From capacity.json's entry."""
        sat = entry.get("saturated") or {}
        probes = [CapacityProbe(float(p["rate_req_s"]), bool(p.get("sustained")), str(p.get("folder") or ""),
                                str(p.get("reason") or ""), _rate(p.get("offered_req_s")))
                  for p in entry.get("probes") or []]
        return cls(label, *(entry.get(k) for k in ("estimate_req_s", "lo_req_s", "hi_req_s", "estimate_tok_s",
                                                   "lo_tok_s", "hi_tok_s")),
                   sat.get("req_s"), sat.get("req_s_lo"), sat.get("req_s_hi"), probes, str(entry.get("note") or ""))


@dataclass(slots=True)
class CapacityResult(Runs):
    """Each strategy's saturated rate μ and capacity (capacity.json, typed) and where it was written."""

    strategies: dict[str, StrategyCapacity]
    out: Path | None  # None: searched in virtual time with no folder asked for
    simulated: bool = False  # in virtual time (the sim backend's step model), not on live workers
    doc: dict = field(default_factory=dict)  # capacity.json as written

    @classmethod
    def of(cls, doc: dict, out: str | Path | None) -> "CapacityResult":
        """From capacity.json's content."""
        found = {label: StrategyCapacity.of(label, entry) for label, entry in (doc.get("strategies") or {}).items()}
        return cls(found, None if out is None else Path(out), bool(doc.get("simulated")), doc)

    @property
    def estimates(self) -> dict[str, float | None]:
        """Label → capacity estimate (req/s; None when it could not be bracketed)."""
        return {label: c.estimate_req_s for label, c in self.strategies.items()}

    def lines(self) -> list[str]:
        """The capacity table as `batchlab capacity` prints it."""
        from batchlab.report.capacities import capacity_text

        return list(capacity_text(self.doc["strategies"]))

    def folders(self) -> list[Path]:
        """The live probes' run folders (none in virtual time)."""
        if self.out is None:
            return []
        return [self.out / p.folder for c in self.strategies.values() for p in c.probes
                if p.folder and (self.out / p.folder).is_dir()]

    def points(self) -> "pd.DataFrame":
        """One row per probe: label, rate_req_s (nominal), offered_req_s (what its arrivals offered, the rate its
        verdict judged), sustained, folder, reason."""
        import pandas as pd

        return pd.DataFrame([{"label": c.label, **asdict(p)} for c in self.strategies.values() for p in c.probes],
                            columns=["label", "rate_req_s", "offered_req_s", "sustained", "folder", "reason"])


@dataclass(frozen=True, slots=True)
class Candidate:
    """One knob setting tune simulated: its rank (1: best), knobs and figures (goodput, latency s, tok/s)."""

    rank: int
    knobs: dict
    goodput: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    throughput_tok_s: float | None
    finished: int = 0
    submitted: int = 0

    @classmethod
    def of(cls, row: dict) -> "Candidate":
        """From tune.json's candidate (or its baseline: rank 0)."""
        return cls(int(row.get("rank", 0)), dict(row.get("knobs") or {}),
                   *(row.get(k) for k in ("goodput", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s",
                                          "e2e_p99_s", "throughput_tok_s")),
                   int(row.get("finished") or 0), int(row.get("submitted") or 0))


@dataclass(slots=True)
class TuneResult:
    """A strategy's knobs searched in the simulator: the candidates ranked by goodput under the SLOs, the
    untuned baseline, the space searched and the knobs held; with confirm, predicted vs measured live."""

    out: Path
    strategy: str
    slos: dict[str, float]
    space: dict[str, list]
    held: dict
    baseline: Candidate
    candidates: list[Candidate]
    notes: list[str]
    confirm: list[dict]  # per live run: rank, knobs, out, predicted, measured, rel_error
    record: dict  # tune.json as written

    @classmethod
    def of(cls, out: str | Path, record: dict) -> "TuneResult":
        """From tune.json's content."""
        return cls(Path(out), str(record["strategy"]), dict(record.get("slos") or {}), dict(record["space"]),
                   dict(record.get("held") or {}), Candidate.of(record["baseline"]),
                   [Candidate.of(c) for c in record["candidates"]], list(record.get("notes") or []),
                   list(record.get("confirm") or []), record)

    @property
    def best(self) -> Candidate:
        """The candidate ranked first."""
        return self.candidates[0]

    def points(self) -> "pd.DataFrame":
        """One row per candidate (rank, each knob, its figures), best first."""
        import pandas as pd

        rows = [{"rank": c.rank, **c.knobs, **{k: v for k, v in asdict(c).items() if k not in ("rank", "knobs")}}
                for c in self.candidates]
        return pd.DataFrame(rows)

