"""How much the rest of the machine used the CPU while a run ran, from samples of the machine's CPU time and
the run's own processes' (runner.cpu_meter takes them); pure: samples in, figures out.

`other` is all busy CPU time (user, nice, system, irq, softirq) less the run's own processes' (the launcher
and every process it started), in cores: 1.0 is one core kept busy by something else for the whole window.
`steal` is the time the hypervisor gave this VM's virtual CPUs to others (Linux reports it; 0 elsewhere).
A run is **disturbed** when the rest of the machine used more than DISTURBED_CORES on average, or steal took
more than DISTURBED_STEAL of the CPUs: docs/validation.md ("A busy machine") says why these figures.
"""
import math
from dataclasses import asdict, dataclass

DISTURBED_CORES = 0.25  # other work's mean CPU (cores) above which a run's speed figures may be bent
DISTURBED_STEAL = 0.05  # share of the CPUs' time the hypervisor gave to other VMs
BURST_CORES = 0.5  # a sweep runs a point again when its other CPU exceeds the sweep's usual by this much


@dataclass(slots=True)
class CpuSample:
    """Cumulative CPU seconds at one moment (monotonic s): the machine's busy and steal time, the run's own."""

    t: float
    busy_s: float
    steal_s: float
    own_s: float


@dataclass(slots=True)
class Interference:
    """The rest of the machine's CPU over a run's window (cores: CPU seconds per second)."""

    cores: int  # CPUs the machine has
    window_s: float
    other_cores: float  # mean
    other_peak_cores: float  # the most over one sampling interval
    own_cores: float  # the run's own processes
    steal_share: float  # of all CPUs' time
    samples: int

    @property
    def disturbed(self) -> bool:
        """Whether other work (or the hypervisor) took enough CPU to bend the run's speed figures."""
        return self.other_cores > DISTURBED_CORES or self.steal_share > DISTURBED_STEAL

    def as_dict(self) -> dict:
        """summary.json's `interference` entry (rounded: these are meter readings, not exact)."""
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()} | {
            "disturbed": self.disturbed}

    def text(self) -> str:
        """'other work 1.02 of 2 cores (peak 1.10), steal 0%' for a terminal or report line."""
        steal = f", steal {self.steal_share:.0%}" if self.steal_share >= 0.005 else ""
        return f"other work {self.other_cores:.2f} of {self.cores} cores (peak {self.other_peak_cores:.2f}){steal}"


def interference(samples: list[CpuSample], cores: int, start_s: float = -math.inf,
                 end_s: float = math.inf) -> Interference | None:
    """The figures over the samples within [start_s, end_s] (None with fewer than two there)."""
    inside = [s for s in samples if start_s <= s.t <= end_s]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return None
    first, last = inside[0], inside[-1]
    window = last.t - first.t
    other = [max((b.busy_s - a.busy_s) - (b.own_s - a.own_s), 0.0) / (b.t - a.t)
             for a, b in zip(inside, inside[1:]) if b.t > a.t]
    total_other = max((last.busy_s - first.busy_s) - (last.own_s - first.own_s), 0.0)
    return Interference(cores=cores, window_s=window, other_cores=total_other / window,
                        other_peak_cores=max(other), own_cores=max(last.own_s - first.own_s, 0.0) / window,
                        steal_share=max(last.steal_s - first.steal_s, 0.0) / (window * max(cores, 1)),
                        samples=len(inside))


def read(entry: object) -> Interference | None:
    """A summary's or a sweep index's `interference` entry back as Interference (None: absent or malformed)."""
    if not isinstance(entry, dict):
        return None
    try:
        return Interference(**{k: entry[k] for k in Interference.__slots__})
    except (KeyError, TypeError):
        return None


def is_burst(found: Interference | None, usual_cores: float | None) -> bool:
    """A run disturbed by more than the sweep's usual background: other work above DISTURBED_CORES and
    above `usual_cores` (the median over the sweep's runs so far) by BURST_CORES. A neighbour that stays
    for the whole sweep disturbs every run alike and is reported, not chased by running points again."""
    if found is None or not found.disturbed:
        return False
    return usual_cores is None or found.other_cores > usual_cores + BURST_CORES or found.steal_share > DISTURBED_STEAL
