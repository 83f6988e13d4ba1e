"""A sweep's `grid:` section as typed settings (pydantic), checked as a whole before anything runs: an
unknown key, here or under `rates: {auto: ...}` / `repeats: {auto: ...}`, is refused with its close match."""
import difflib
from typing import Literal

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError,
                      model_validator)

from batchlab.collector.capacity import MAX_PROBES, WIDTH
from batchlab.protocol.setting_groups import BatchlabError

DEFAULT_STARTUP_TIMEOUT_S = 900.0  # model loads, engine compilation and warm-up: minutes on a slow host


class SweepError(BatchlabError, ValueError):
    """A sweep that cannot run; the CLI prints it as one line and exits 1."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AutoRates(_Strict):
    """grid.rates.auto: every strategy's saturated rate μ measured and its capacity searched
    (cli.capacity_search), then `points` rates log-spaced from `low` × the lowest capacity to `high` × the
    highest; or, when `fractions` are given, those fractions of the `probe` entry's burst."""

    fractions: list[PositiveFloat] | None = None
    points: int = Field(5, ge=2)
    low: PositiveFloat = 0.3
    high: PositiveFloat = 1.3
    probe: str | None = None  # the entry whose burst the fractions scale (default: dynamic, else the first)
    probe_requests: PositiveInt = 24  # with fractions: the burst, this many requests within probe_duration_s
    probe_duration_s: PositiveFloat = 1.0
    saturated_duration_s: PositiveFloat = 20.0  # each saturated run's traffic (μ), per strategy and repeat
    # saturated runs per strategy (at least; the grid's repeats when more): the headline's throughput claim is
    # paired by repeat, and fewer than 3 repeats cannot show the spread between runs (docs/statistics.md)
    saturated_repeats: PositiveInt = 3
    saturated_clients: int = Field(0, ge=0)  # its closed-loop clients; 0: 2 × the batch cap × the workers
    search_duration_s: PositiveFloat = 10.0  # traffic per capacity probe; its queue drains after
    search_requests: PositiveInt = 60  # ... or longer: enough traffic for this many arrivals at its rate
    width: PositiveFloat = WIDTH  # a search stops when hi / lo ≤ 1 + width
    max_probes: PositiveInt = MAX_PROBES

    @model_validator(mode="after")
    def _span(self) -> "AutoRates":
        if not self.low < self.high:
            raise ValueError("grid.rates.auto needs 0 < low < high")
        return self

    @property
    def spanned(self) -> bool:
        """Rates span every strategy's knee (no fractions given)."""
        return self.fractions is None


class AutoRepeats(_Strict):
    """grid.repeats.auto (cli.sweep_repeats): `start` repeats, then more until every headline latency
    interval is at most width_pct percentage points wide, or `max` repeats ran."""

    start: PositiveInt = 1
    max: PositiveInt = 4
    width_pct: PositiveFloat = 20.0

    @model_validator(mode="after")
    def _order(self) -> "AutoRepeats":
        if self.start > self.max:
            raise ValueError("grid.repeats.auto needs 1 ≤ start ≤ max and width_pct > 0")
        return self


class Grid(_Strict):
    """A sweep's `grid:` section, checked as a whole before anything runs."""

    strategies: list[str | dict] = []
    rates: list[PositiveFloat] | None = Field(None, min_length=1)  # req/s; None: base.rate, or rates_auto
    rates_auto: AutoRates | None = None  # `rates: {auto: {...}}`
    concurrency: list[PositiveInt] | None = Field(None, min_length=1)  # closed loop: clients per point
    repeats: PositiveInt = 1
    repeats_auto: AutoRepeats | None = None  # `repeats: auto` or `{auto: {...}}`: repeats = its start
    seed: int = 0
    point_timeout_s: NonNegativeFloat = 0.0  # from a point's first request; 0: a point runs until it drains
    startup_timeout_s: NonNegativeFloat = DEFAULT_STARTUP_TIMEOUT_S  # launch until the first request; 0: none
    order: Literal["auto", "interleaved", "grouped"] = "auto"  # auto: interleaved unless a point runs on a GPU

    @model_validator(mode="before")
    @classmethod
    def _autos(cls, raw: dict) -> dict:
        """`rates` or `repeats` given as {auto: {...}}, {...} or `auto` fill rates_auto / repeats_auto."""
        raw = dict(raw)
        for key in ("rates", "repeats"):
            if raw.get(key) == "auto" or isinstance(raw.get(key), dict):
                value = raw.pop(key)
                raw[f"{key}_auto"] = underscored(value.get("auto", value) or {}) if isinstance(value, dict) else {}
        return raw

    @model_validator(mode="after")
    def _loads(self) -> "Grid":
        if self.repeats_auto:
            self.repeats = self.repeats_auto.start
        if self.concurrency and (self.rates or self.rates_auto):
            raise ValueError("grid.concurrency sweeps closed-loop load: it does not go with grid.rates")
        return self


GRID_KEYS = sorted(set(Grid.model_fields) - {"rates_auto", "repeats_auto"})


def parse_grid(raw: dict, where: object) -> Grid:
    """The grid, or SweepError naming the key: an unknown one with its close matches."""
    try:
        return Grid(**raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = [str(k).replace("_auto", ".auto") for k in error["loc"] if isinstance(k, str)]
        if error["type"] == "extra_forbidden":
            *section, key = loc
            model = {"rates.auto": AutoRates, "repeats.auto": AutoRepeats}.get(".".join(section))
            known = sorted(model.model_fields) if model else GRID_KEYS
            close = difflib.get_close_matches(key, known, n=2)
            hint = f"did you mean {', '.join(close)}?" if close else f"expected {', '.join(known)}"
            raise SweepError(f"{where}: unknown {'.'.join(['grid', *section])} key {key} ({hint})") from None
        if error["type"] == "value_error":
            raise SweepError(f"{where}: {error['ctx']['error']}") from None
        said = ".".join(k for k in loc if k[0].islower() and "[" not in k)
        raise SweepError(f"{where}: grid.{said}: {error['msg'].lower()}, got {error.get('input')!r}") from None


def checked_auto(values: dict, where: str) -> AutoRates:
    """grid.rates.auto's settings from `values`, or the one-line SweepError."""
    return parse_grid({"rates": {"auto": values}}, where).rates_auto


def underscored(mapping: dict) -> dict:
    """The mapping with dashes in its keys read as underscores."""
    return {str(k).replace("-", "_"): v for k, v in mapping.items()}
