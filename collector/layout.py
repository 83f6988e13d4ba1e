"""Names of the files and folders in a sweep folder (written by the sweep, read by the report); a run
folder's own are protocol.run_dir's.

A sweep's point folders are Hive partitions, OUT/sweep_label=<label>/sweep_rate=<r>/sweep_repeat=<k>/, named
apart from every column of the tables (each table holds the run's own label, rate and repeat, typed), so DuckDB,
pyarrow, Polars and Spark read a whole sweep's tables as one table, the folder keys beside the columns; a
value is percent-encoded as pyarrow writes it (a label with `/`, `=`, `%` or a space stays one folder name).
Every name of a point folder is made and parsed here (a closed-loop load: sweep_concurrency=<n>). Sweeps
written before keep being read: strategy=<label>/rate=<r>/repeat=<k>/ (keys that clashed with the columns),
and before that <label>/rate-<r>/rep-<k>/.
"""
import math
import re
from pathlib import Path
from urllib.parse import quote, unquote

INDEX_FILE = "sweep.json"  # a sweep's index of points
DONE_FILE = "point.json"  # a point whose run returned (summary.json alone is also written on failure)
FAILED_FILE = "FAILED.txt"  # a point that failed, with the reason
PROBE_DIR = "_probe"  # the capacity probe of a sweep with automatic rates
WORKERS_DIR = "_workers"  # a sweep's warm workers' own output (start-up, between points)
CAPACITY_DIR = "_capacity"  # a capacity search's probes: _capacity/<point_dir> (bursts: _probe/<point_dir>)
SATURATED_DIR = "_saturated"  # each strategy's saturated runs (μ): _saturated/<saturated_dir>
CAPACITY_FILE = "capacity.json"  # every strategy's capacity bracket, estimate and probes
TWIN_DIR = "_twin"  # the study's twin (lab.twin): presets/, its curves (a simulated sweep) and TWIN_ERRORS_FILE
TWIN_ERRORS_FILE = "errors.json"  # the twin against every live grid point (lab.twin_curves)
# the figures TWIN_ERRORS_FILE compares, by key (its keys; report.twin's and the terminal's names)
TWIN_FIGURES = {"ttft_p50": "TTFT p50", "e2e_p50": "E2E p50", "throughput": "throughput"}

LABEL_KEY, RATE_KEY, REPEAT_KEY = "sweep_label", "sweep_rate", "sweep_repeat"  # a point's keys, outermost first
CONCURRENCY_KEY = "sweep_concurrency"  # in a closed-loop sweep, the middle key instead of the rate
POINT_DEPTH = 3  # folders from a sweep's OUT to a point's
# The layouts sweeps wrote before, still read (never resumed: a resume would measure every point again beside them)
HIVE_V1 = ("strategy", "rate", "repeat", "concurrency")  # label, rate, repeat and closed-loop keys
OLD_LAYOUTS = "strategy=<label>/rate=<r>/repeat=<k> or <label>/rate-<r>/rep-<k>"
_OLD_RATE, _OLD_REPEAT = re.compile(r"rate-([0-9.eE+-]+|inf)"), re.compile(r"rep-(\d+)")


def point_dir(label: str, rate: float, repeat: int, concurrency: int = 0) -> Path:
    """A point's folder relative to the sweep's OUT: sweep_label=<label>/sweep_rate=<r>/sweep_repeat=<k>, or
    with `concurrency` (a closed-loop point) sweep_label=<label>/sweep_concurrency=<n>/sweep_repeat=<k>."""
    load = _part(CONCURRENCY_KEY, str(concurrency)) if concurrency else _part(RATE_KEY, f"{rate:g}")
    return Path(_part(LABEL_KEY, label), load, _part(REPEAT_KEY, str(repeat)))


def saturated_dir(label: str, repeat: int) -> Path:
    """A saturated run's folder under SATURATED_DIR: sweep_label=<label>/sweep_rate=inf/sweep_repeat=<k> (closed
    loop: no planned rate), so every run folder of a sweep, its search's too, has the same partition keys."""
    return point_dir(label, math.inf, repeat)


def _part(key: str, value: str) -> str:
    return f"{key}={quote(value, safe='')}"


def partition(name: str, key: str) -> str | None:
    """The decoded value of a `key=value` folder name, else None."""
    found, sep, value = name.partition("=")
    return unquote(value) if sep and found == key else None


def point_of(folder: Path) -> tuple[str, float, int] | None:
    """(label, rate, repeat) of a point folder in any layout (this one or an older one), else None; a
    closed-loop point (sweep_concurrency=<n>) has no planned rate: inf, as its settings record."""
    if len(folder.parts) < POINT_DEPTH:
        return None
    names = folder.parts[-POINT_DEPTH:]
    for label_key, rate_key, repeat_key, clients_key in ((LABEL_KEY, RATE_KEY, REPEAT_KEY, CONCURRENCY_KEY), HIVE_V1):
        label, rate, repeat = (partition(n, k) for n, k in zip(names, (label_key, rate_key, repeat_key)))
        if rate is None and partition(names[1], clients_key) is not None:
            rate = "inf"
        if label is not None and rate is not None and repeat is not None:
            break
    else:
        old_rate, old_repeat = _OLD_RATE.fullmatch(names[1]), _OLD_REPEAT.fullmatch(names[2])
        if not (old_rate and old_repeat):
            return None
        label, rate, repeat = names[0], old_rate.group(1), old_repeat.group(1)
    try:
        return label, float(rate), int(repeat)
    except ValueError:
        return None


def rate_of(folder: Path) -> float | None:
    """The planned rate a folder's name gives (`sweep_rate=<r>`, or an older `rate=<r>` or `rate-<r>`), else
    None."""
    value = partition(folder.name, RATE_KEY)
    value = partition(folder.name, HIVE_V1[1]) if value is None else value
    if value is None:
        match = _OLD_RATE.fullmatch(folder.name)
        value = match.group(1) if match else None
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def is_old_layout(relative_dir: str) -> bool:
    """Whether a point's folder (relative to OUT, as sweep.json's `dir`) is in an older layout."""
    parts = Path(relative_dir).parts
    return len(parts) == POINT_DEPTH and point_of(Path(relative_dir)) is not None and \
        partition(parts[0], LABEL_KEY) is None
