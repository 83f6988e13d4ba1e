"""A run's summary.json as typed data: the collector writes a Summary, every reader gets one back. The
headline figures are required; the sections later steps add are optional; any other key is kept as it is."""
import math
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, NonNegativeInt, PrivateAttr, ValidationError

from batchlab.protocol.files import write_json_atomic
from batchlab.protocol.run_dir import RunDir
from batchlab.protocol.errors import SummaryError


def _not_negative(value: float) -> float:
    if value < 0:  # NaN passes: a figure nothing measured
        raise ValueError("must not be negative")
    return value


Count = NonNegativeInt
Amount = Annotated[float, AfterValidator(_not_negative)]  # a duration, rate or share: ≥ 0 (or NaN)


class Latency(BaseModel):
    """One latency metric's statistics (s; None when no request has the metric)."""

    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class Goodput(BaseModel):
    """Submitted requests that finished and met every SLO (s): met ÷ submitted."""

    slos: dict[str, float]
    met: Count
    submitted: Count
    fraction: Amount | None


class Summary(BaseModel):
    """A run's headline figures (counts, s, tok/s, req/s), its settings and the sections added later."""

    model_config = ConfigDict(extra="allow")

    scheduled: Count
    submitted: Count
    finished: Count
    failed: Count
    failure_reasons: dict[str, Count]
    output_tokens: Count
    window_s: Amount
    throughput_tok_s: Amount
    requests_per_s: Amount
    ttft: Latency
    tpot: Latency
    itl: Latency
    e2e: Latency
    queue_wait: Latency
    settings: dict
    goodput: Goodput | None = None
    peak_memory_bytes: Count = 0
    worker_stats: dict[str, dict] = {}
    end_reason: str = ""
    stop_signal: int = 0
    harness_cpu: dict = {}
    harness_lag: dict = {}
    interference: dict | None = None  # the rest of the machine's CPU while the run ran (stats.interference)
    role_deaths: list = []
    schedule: dict = {}  # the schedule's notes (prompt source, capped lengths, a trace's own rate)
    timing_fidelity: dict | None = None
    prefix_cache: dict | None = None
    _folder: Path | None = PrivateAttr(None)  # where read_summary found it

    @property
    def folder(self) -> Path:
        """The run's folder: where this summary was read, else the one its settings name."""
        return self._folder or Path(str(self.settings.get("out", ".")))

    def figures(self) -> dict[str, float | int | None]:
        """The headline figures flat, one value each (a DataFrame row): counts, window, throughput, each latency's
        mean and percentiles (ttft_p50, ... in s), goodput's fraction (None without SLOs), peak memory."""
        flat: dict = self.model_dump(include={"scheduled", "submitted", "finished", "failed", "window_s",
                                              "throughput_tok_s", "requests_per_s", "peak_memory_bytes"})
        for metric in ("ttft", "tpot", "itl", "e2e", "queue_wait"):
            latency = getattr(self, metric, None)
            for stat in ("mean", "p50", "p90", "p99"):
                flat[f"{metric}_{stat}"] = getattr(latency, stat, None) if latency is not None else None
        flat["goodput"] = self.goodput.fraction if self.goodput else None
        return flat

    def to_json(self) -> dict:
        """The keys this summary was given (and set), in JSON's types: NaN → null, the rate inf → "inf"
        (as vLLM writes it)."""
        out = self.model_dump(exclude_unset=True)
        rate = self.settings.get("rate")
        if isinstance(rate, float) and math.isinf(rate):
            out["settings"] = {**out["settings"], "rate": "inf"}
        return _jsonable(out)


def headline(summary: Summary) -> dict:
    """The figures a sweep's point.json repeats: finished, failed, throughput_tok_s and window_s."""
    return summary.model_dump(include={"finished", "failed", "throughput_tok_s", "window_s"})


def read_summary(folder: Path) -> Summary:
    """A run folder's summary.json; SummaryError (one line) when it is missing or malformed."""
    path = RunDir(folder).summary
    try:
        summary = Summary.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise SummaryError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise SummaryError(f"{path}: not a batchlab run summary ({where}: {first['msg'].lower()})") from None
    summary._folder = Path(folder)
    return summary


def _jsonable(value: object) -> object:
    """NaN → None, numpy scalars → Python, bytes → hex, anything else JSON lacks → its text, recursively
    (summary.json stays strict JSON whatever a peer's settings or stats held)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def write_summary(folder: Path, summary: Summary) -> None:
    """A run folder's summary.json, strict JSON, written atomically."""
    write_json_atomic(RunDir(folder).summary, summary.to_json(), allow_nan=False)
