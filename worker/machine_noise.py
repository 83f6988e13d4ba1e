"""A busy machine, simulated: how much slower than its step model the `sim` worker runs at each moment of a run.

Beside `speed_noise` (one factor for the whole run, already in the run's step model: worker.sim.run_speed),
two parts that move within a run, each seeded by the run's seed, repeat and label (the same run plays the
same machine; two strategies of one repeat play different minutes of it, as runs one after another do):

- `speed_drift` σ with `speed_drift_s` τ: the speed moving within the run, log speed an Ornstein–Uhlenbeck
  process (stationary σ, correlation time τ);
- a neighbour that takes `neighbour_share` of the worker's time in bursts: on for a mean of
  `neighbour_on_s`, off for a mean of `neighbour_off_s` (exponential lengths, starting at a random phase);
  while it is on, every step takes 1 ÷ (1 − share) as long.

`factor(t)` is the product at t seconds after the run's first step (a step's whole duration is scaled by the
factor at its start). The simulator plays the same factors in virtual time.
"""
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

GRID_STEPS_PER_TAU = 10  # the drift path's grid: τ / this


def _rng(*keys: object) -> np.random.Generator:
    digest = hashlib.sha256(repr(keys).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


@dataclass
class MachineNoise:
    """A run's slowdown over time (see the module docstring); all zeros: none (factor 1)."""

    speed_drift: float = 0.0
    speed_drift_s: float = 5.0
    neighbour_share: float = 0.0
    neighbour_on_s: float = 5.0
    neighbour_off_s: float = 10.0
    keys: tuple = ()
    _drift: list[float] = field(init=False, default_factory=list)  # log speed on the grid
    _switches: list[float] = field(init=False, default_factory=list)  # on/off boundaries, s
    _starts_on: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._drift_rng, self._burst_rng = _rng("drift", *self.keys), _rng("burst", *self.keys)
        if self.neighbour_share > 0:
            period = self.neighbour_on_s + self.neighbour_off_s
            self._starts_on = bool(self._burst_rng.random() < self.neighbour_on_s / period)
            self._switches = [float(self._burst_rng.exponential(self.neighbour_on_s if self._starts_on
                                                                 else self.neighbour_off_s))]

    @property
    def active(self) -> bool:
        """Whether any part slows the worker down."""
        return self.speed_drift > 0 or self.neighbour_share > 0

    def _drift_at(self, t: float) -> float:
        """The log-speed drift at t (an OU path on a grid of τ / GRID_STEPS_PER_TAU, extended as needed)."""
        if self.speed_drift <= 0:
            return 0.0
        dt = self.speed_drift_s / GRID_STEPS_PER_TAU
        k = max(int(t / dt), 0)
        keep = math.exp(-dt / self.speed_drift_s)
        while len(self._drift) <= k:
            if not self._drift:
                self._drift.append(self.speed_drift * float(self._drift_rng.standard_normal()))
            else:
                step = self.speed_drift * math.sqrt(1 - keep * keep) * float(self._drift_rng.standard_normal())
                self._drift.append(keep * self._drift[-1] + step)
        return self._drift[k]

    def _neighbour_on(self, t: float) -> bool:
        """Whether the neighbour holds its share at t."""
        if self.neighbour_share <= 0 or t < 0:
            return False
        while self._switches[-1] <= t:
            on = self._starts_on == (len(self._switches) % 2 == 0)  # the state that starts at the last switch
            self._switches.append(self._switches[-1] + float(self._burst_rng.exponential(
                self.neighbour_on_s if on else self.neighbour_off_s)))
        index = int(np.searchsorted(self._switches, t, side="right"))  # switches passed by t
        return self._starts_on == (index % 2 == 0)

    def factor(self, t: float) -> float:
        """A step starting t s after the run's first takes this many times its modelled duration."""
        slow = 1.0 / (1.0 - self.neighbour_share) if self._neighbour_on(t) else 1.0
        return math.exp(self._drift_at(t)) * slow

    def shifted(self, offset_s: float) -> "ShiftedNoise":
        """This machine seen from a run that starts offset_s into it (a study's runs along one timeline)."""
        return ShiftedNoise(self, offset_s)

    def facts(self) -> dict:
        """The run's record of its simulated machine."""
        return {"speed_drift": self.speed_drift, "speed_drift_s": self.speed_drift_s,
                "neighbour_share": self.neighbour_share, "neighbour_on_s": self.neighbour_on_s,
                "neighbour_off_s": self.neighbour_off_s}


@dataclass
class ShiftedNoise:
    """A MachineNoise read from offset_s on (its factor(t) is the machine's at offset_s + t)."""

    machine: MachineNoise
    offset_s: float

    @property
    def active(self) -> bool:
        return self.machine.active

    def factor(self, t: float) -> float:
        return self.machine.factor(self.offset_s + t)

    def facts(self) -> dict:
        return {**self.machine.facts(), "offset_s": self.offset_s}


def of_config(cfg) -> MachineNoise:
    """The run's simulated machine from its settings, seeded by its seed, repeat and label."""
    return MachineNoise(cfg.speed_drift, cfg.speed_drift_s, cfg.neighbour_share,
                        cfg.neighbour_on_s, cfg.neighbour_off_s,
                        keys=(cfg.seed, cfg.repeat, cfg.label or cfg.strategy))
