"""A sweep's `grid:` section read into its typed settings (protocol.study_settings), checked as a whole before
anything runs: an unknown key, here or under `rates: {auto: ...}` / `repeats: {auto: ...}`, is refused with its
close match."""
import difflib

from pydantic import ValidationError

from batchlab.protocol.setting_groups import BatchlabError
from batchlab.protocol.study_settings import GRID_KEYS, AutoRates, AutoRepeats, Grid, underscored  # noqa: F401


class SweepError(BatchlabError, ValueError):
    """A sweep that cannot run; the CLI prints it as one line and exits 1."""


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

