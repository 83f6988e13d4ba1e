"""Find and load the runs under a folder: a sweep (sweep.json + point folders) or one `batchlab run`."""
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from collector.layout import FAILED_FILE, INDEX_FILE, PROBE_DIR, SUMMARY_FILE
from collector.parts import load_table



class ReportError(ValueError):
    """A folder that holds nothing to report; the CLI prints it as one line and exits 1."""


@dataclass(slots=True)
class RunData:
    """One run's tables and summary (times in s since its t0)."""

    label: str
    rate: float
    repeat: int
    folder: Path
    summary: dict
    requests: pd.DataFrame
    tokens: pd.DataFrame
    batches: pd.DataFrame
    steps: pd.DataFrame

    @property
    def settings(self) -> dict:
        """The run's settings (RunConfig fields plus host facts and worker facts)."""
        return self.summary.get("settings", {})


@dataclass(slots=True)
class FailedPoint:
    """A point of the sweep that did not complete, and why."""

    label: str
    rate: float
    repeat: int
    reason: str


@dataclass(slots=True)
class Collection:
    """Everything a report is made of."""

    root: Path
    runs: list[RunData] = field(default_factory=list)
    failed: list[FailedPoint] = field(default_factory=list)
    index: dict = field(default_factory=dict)

    def labels(self) -> list[str]:
        """Strategy labels in the order of the sweep's grid (else first seen)."""
        order = [e["label"] for e in self.index.get("entries", [])]
        seen = [r.label for r in self.runs] + [f.label for f in self.failed]
        return list(dict.fromkeys([*[o for o in order if o in seen], *seen]))

    def rates(self) -> list[float]:
        """Every rate with at least one completed run, ascending."""
        return sorted({r.rate for r in self.runs})

    def group(self, label: str, rate: float) -> list[RunData]:
        """The completed repeats of one strategy at one rate."""
        return [r for r in self.runs if r.label == label and r.rate == rate]


def label_of(settings: dict) -> str:
    """A run's label when no sweep names it: vllm, or the strategy."""
    return "vllm" if settings.get("backend") == "vllm" else str(settings.get("strategy", "run"))


def load_run(folder: Path, label: str | None = None, repeat: int | None = None) -> RunData:
    """A run folder's summary and tables."""
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    settings = summary.get("settings", {})
    if repeat is None:
        match = re.fullmatch(r"rep-(\d+)", folder.name)
        repeat = int(match.group(1)) if match else 0
    tables = {name: load_table(folder, name) for name in ("requests", "tokens", "batches", "steps")}
    return RunData(label or label_of(settings), float(settings.get("rate", 0.0)), repeat, folder,
                   summary, **tables)


def _from_index(root: Path, index: dict) -> Collection:
    coll = Collection(root, index=index)
    for point in index.get("points", []):
        folder = root / point["dir"]
        if point["status"] in ("done", "skipped") and (folder / SUMMARY_FILE).exists():
            coll.runs.append(load_run(folder, point["label"], point["repeat"]))
        elif point["status"] != "pending":
            reason = point.get("reason") or "no summary.json"
            coll.failed.append(FailedPoint(point["label"], point["rate"], point["repeat"], reason))
    return coll


def _from_scan(root: Path) -> Collection:
    """No index: every folder below root with a summary.json (the probe excluded) is a run."""
    coll = Collection(root)
    for summary in sorted(root.rglob(SUMMARY_FILE)):
        folder = summary.parent
        if PROBE_DIR in folder.relative_to(root).parts:
            continue
        if (folder / FAILED_FILE).exists():
            coll.failed.append(FailedPoint(folder.parent.parent.name, 0.0, 0,
                                           (folder / FAILED_FILE).read_text().strip()))
            continue
        parts = folder.relative_to(root).parts
        coll.runs.append(load_run(folder, parts[-3] if len(parts) >= 3 else None))
    return coll


def load_collection(root: str | Path) -> Collection:
    """A sweep folder (via sweep.json) or any folder holding run folders or being one."""
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"{root} is not a folder")
    index_path = root / INDEX_FILE
    coll = _from_index(root, json.loads(index_path.read_text())) if index_path.exists() else _from_scan(root)
    if not coll.runs and not coll.failed:
        raise ReportError(f"{root} holds no run (no {SUMMARY_FILE} and no {INDEX_FILE})")
    return coll
