"""Synthetic token-length distributions, and the one-line form users write them in.

Text form (YAML `prompt_lengths: 128`, or an option's value), read by parse_lengths and written by
LengthSpec.text():
  "128"            fixed: every request 128 tokens
  "32-512"         uniform integers in [32, 512]
  "64,128,256"     each request draws one of these, uniformly
  "lognormal:mean=256,sigma=0.5,min=32,max=512"   lognormal with this mean, clipped to [min, max]
A YAML mapping of LengthSpec's fields ({dist: lognormal, mean: 256}) or a list of ints works too.
"""
import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

LENGTH_DISTS = ("uniform", "lognormal", "fixed", "choice")


@dataclass(slots=True)
class LengthSpec:
    """A token-length distribution: uniform in [min, max], lognormal with this mean, fixed at mean, or
    a uniform choice among `values`."""

    dist: str = "uniform"
    mean: int = 256
    min: int = 32
    max: int = 512
    sigma: float = 0.5  # lognormal shape (std of the underlying normal)
    values: list[int] = field(default_factory=list)  # choice only

    def check(self, what: str) -> None:
        """ValueError with a clear message for an impossible spec."""
        if self.dist not in LENGTH_DISTS:
            raise ValueError(f"{what}: unknown length distribution {self.dist!r}; expected {LENGTH_DISTS}")
        if self.dist == "choice":
            if not self.values or min(self.values) < 1:
                raise ValueError(f"{what}: a choice needs one or more lengths >= 1, got {self.values}")
            return
        if self.dist == "fixed":
            if self.mean < 1:
                raise ValueError(f"{what}: a fixed length must be >= 1, got {self.mean}")
            return
        if not 1 <= self.min <= self.max:
            raise ValueError(f"{what}: need 1 <= min <= max, got min={self.min} max={self.max}")
        if self.mean < 1 or self.sigma <= 0:
            raise ValueError(f"{what}: need mean >= 1 and sigma > 0, got mean={self.mean} sigma={self.sigma}")

    def text(self) -> str:
        """The one-line form parse_lengths reads back into an equal spec."""
        if self.dist == "fixed":
            return str(self.mean)
        if self.dist == "uniform":
            return f"{self.min}-{self.max}"
        if self.dist == "choice":
            return ",".join(map(str, self.values))
        return f"lognormal:mean={self.mean},sigma={self.sigma!r},min={self.min},max={self.max}"


def sample_lengths(spec: LengthSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` token lengths (int64) from `spec`; lognormal draws are clipped to [min, max]."""
    if spec.dist == "fixed":
        return np.full(n, spec.mean, dtype=np.int64)
    if spec.dist == "choice":
        return np.asarray(spec.values, dtype=np.int64)[rng.integers(0, len(spec.values), size=n)]
    if spec.dist == "uniform":
        return rng.integers(spec.min, spec.max, size=n, endpoint=True, dtype=np.int64)
    mu = np.log(spec.mean) - spec.sigma**2 / 2  # so that E[length] = mean before clipping
    draws = np.rint(rng.lognormal(mu, spec.sigma, size=n))
    return np.clip(draws, spec.min, spec.max).astype(np.int64)


def parse_lengths(value: object, default: LengthSpec, what: str = "lengths") -> LengthSpec:
    """A LengthSpec from an int, a list of ints, a mapping of its fields or the text form (module
    docstring); None or "" gives `default`. ValueError naming `what` for anything else."""
    if value is None or value == "":
        return dataclasses.replace(default)
    try:
        spec = _spec(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read {value!r} as token lengths ({exc}); expected e.g. 128, "
                         f"32-512, 64,128,256 or lognormal:mean=256") from None
    spec.check(what)
    return spec


def _spec(value: object) -> LengthSpec:
    """The spec `value` describes (TypeError / ValueError when it describes none)."""
    if isinstance(value, LengthSpec):
        return dataclasses.replace(value, values=list(value.values))
    if isinstance(value, bool):
        raise TypeError("a bool is not a length")
    if isinstance(value, (int, np.integer)):
        return LengthSpec(dist="fixed", mean=int(value))
    if isinstance(value, (list, tuple)):
        return LengthSpec(dist="choice", values=[_int(v) for v in value])
    if isinstance(value, dict):
        return LengthSpec(**value)
    if isinstance(value, str):
        return _from_text(value.strip())
    raise TypeError(f"a {type(value).__name__} is not a length")


def _from_text(text: str) -> LengthSpec:
    """The spec of the text form."""
    if text.startswith("lognormal"):
        fields = dict(item.split("=", 1) for item in text.partition(":")[2].split(",") if item.strip())
        unknown = set(fields) - {"mean", "sigma", "min", "max"}
        if unknown:
            raise ValueError(f"unknown lognormal field(s) {', '.join(sorted(unknown))}")
        kwargs = {k.strip(): float(v) if k.strip() == "sigma" else _int(v) for k, v in fields.items()}
        return LengthSpec(dist="lognormal", **kwargs)
    if match := re.fullmatch(r"(\d+)\s*-\s*(\d+)", text):
        return LengthSpec(dist="uniform", min=int(match.group(1)), max=int(match.group(2)))
    if "," in text:
        return LengthSpec(dist="choice", values=[_int(v) for v in text.split(",")])
    return LengthSpec(dist="fixed", mean=_int(text))


def _int(value: object) -> int:
    """An integral value as int (12.0 and " 12" are fine; 12.5 and "x" are not)."""
    number = float(value) if isinstance(value, str) else value
    if isinstance(number, bool) or not float(number).is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)
