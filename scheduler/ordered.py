"""Strategies that choose among the queued instead of taking them in arrival order: sjf and edf.

Both rank the oldest `window` queued requests by a key (lower first; ties by arrival) and come in two
forms, set with --strategy-arg mode=static|continuous:
  static      forms a batch the way dynamic does (size, age of the oldest, memory budget), from the best
              ranked requests instead of the oldest;
  continuous  admits the best ranked while the worker has credit (rows and KV), as continuous does.

sjf  shortest predicted job first. The job's size is its output length as a predictor sees it:
     `oracle` (the target length, known in a benchmark), `prompt` (the prompt's length as a proxy) or
     `noisy` (the target times a log-normal error of sigma `noise`, seeded by the run's seed and the
     request id, so a run replays exactly). Aging bound: a request queued longer than `max_age_ms` goes
     before every younger one (oldest first), so no long job starves.
edf  earliest deadline first. A request's deadline is arrival + TTFT SLO (+ TPOT SLO × (output − 1) when
     a TPOT SLO is set: a short job's last token is due sooner); the SLOs are the run's --slo unless
     ttft_slo_ms / tpot_slo_ms set them. With one TTFT SLO and no TPOT SLO every deadline is arrival +
     a constant and edf orders as FCFS: its difference is then `reject_late`, which fails a request whose
     TTFT deadline passed while it queued (reason "deadline") so that the others can still meet theirs.

Pure: no clock (the time is given), no randomness beyond a hash of (seed, request id).
"""
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from batchlab.protocol import RequestMsg
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.errors import term
from batchlab.protocol.settings import parse_slos
from batchlab.protocol.status import FailureReason
from batchlab.scheduler.policies import Capacity, Continuous, Decision, Dynamic, Policy, at_least

MODES = tuple(BatchingMode)
PREDICTORS = ("oracle", "prompt", "noisy")
_MASK = (1 << 64) - 1


@dataclass(slots=True)
class RankedParams:
    """What sjf and edf share (each defaults to the run's setting of the same name where there is one)."""

    mode: str = BatchingMode.STATIC.value  # static: batch-forming; continuous: admission order
    max_batch_size: int = 16  # rows per batch (static) or running at once (continuous); the worker's rows
    max_wait_ms: float = 50.0  # static: launch once the oldest queued request waited this long
    max_new_tokens: int = 128  # static: output tokens a padded batch reserves KV for, per row
    window: int = 256  # queued requests ranked per decision (the oldest ones)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        at_least(1, max_batch_size=self.max_batch_size, max_new_tokens=self.max_new_tokens, window=self.window)
        at_least(0, max_wait_ms=self.max_wait_ms)


class Ranked:
    """A policy that launches the best ranked queued requests (see the module docstring)."""

    name: ClassVar[str] = "ranked"
    mode: ClassVar[str] = BatchingMode.STATIC  # the class's default; each policy's own comes from its `mode` parameter

    def __init__(self, params: RankedParams) -> None:
        self.params = params
        self.mode = params.mode  # the worker's mode (scheduler.strategies reads the built policy's)
        self.lookahead = params.window  # the core shows this many queued requests
        # what decides over the ranked requests: dynamic's triggers (its cap halves on OOM), or continuous's
        # credit rule (rows and KV)
        self.rule: Policy = (Continuous(params.max_batch_size) if params.mode == BatchingMode.CONTINUOUS else
                             Dynamic(params.max_batch_size, params.max_wait_ms / 1000.0, params.max_new_tokens))

    @property
    def rows(self) -> int:
        """The most rows its worker runs at once."""
        return self.params.max_batch_size

    def key(self, request: RequestMsg, now: float) -> tuple:
        """Rank of a queued request (lower goes first)."""
        raise NotImplementedError

    def late(self, request: RequestMsg, now: float) -> bool:
        """True when the request is to be failed instead of served."""
        return False

    def decide(self, queue: Sequence[RequestMsg], now: float, cap: Capacity,
               end_of_stream: bool) -> Decision:
        reject = tuple(i for i, r in enumerate(queue) if self.late(r, now))
        gone = set(reject)
        order = sorted((i for i in range(len(queue)) if i not in gone), key=lambda i: (self.key(queue[i], now), i))
        decision = self.rule.decide([queue[i] for i in order], now, cap, end_of_stream)
        if decision.n:  # the first n of the ranked order are positions of the queue shown
            decision.pick, decision.n = tuple(order[:decision.n]), 0
        if reject:
            decision.reject, decision.reject_reason = reject, FailureReason.DEADLINE
        return decision

    def on_batch_done(self, size: int, oom: bool) -> None:
        """As its rule: the static cap halves on OOM (min 1), after enough clean batches it is probed up by one."""
        self.rule.on_batch_done(size, oom)


@dataclass(slots=True)
class SJFParams(RankedParams):
    """sjf's parameters."""

    predictor: str = "oracle"  # oracle | prompt | noisy
    noise: float = 0.5  # noisy: sigma of the log-normal relative error
    max_age_ms: float = 30000.0  # aging bound: a request queued longer goes first
    seed: int = 0  # noisy: the run's seed, so the errors replay

    def __post_init__(self) -> None:
        RankedParams.__post_init__(self)
        if self.predictor not in PREDICTORS:
            raise ValueError(f"predictor must be one of {', '.join(PREDICTORS)}, got {self.predictor!r}")
        at_least(0, noise=self.noise, max_age_ms=self.max_age_ms)


class SJF(Ranked):
    """Shortest predicted job first, with an aging bound (module docstring)."""

    name: ClassVar[str] = "sjf"
    Params: ClassVar[type] = SJFParams

    def key(self, request: RequestMsg, now: float) -> tuple:
        if now - request.arrival_time >= self.params.max_age_ms / 1000.0:
            return (0, request.arrival_time)  # aged: before every younger one, oldest first
        return (1, self.predict(request))

    def predict(self, request: RequestMsg) -> float:
        """The job size the predictor reports (output tokens)."""
        p = self.params
        if p.predictor == "prompt":
            return float(request.prompt_len)
        if p.predictor == "oracle" or p.noise == 0:
            return float(request.output_len)
        return request.output_len * math.exp(p.noise * _normal(p.seed, request.request_id))


@dataclass(slots=True)
class EDFParams(RankedParams):
    """edf's parameters."""

    slo: list = field(default_factory=list)  # the run's --slo (ttft=..., tpot=...)
    ttft_slo_ms: float = 0.0  # > 0: this TTFT SLO instead of the run's
    tpot_slo_ms: float = 0.0  # > 0: this TPOT SLO instead of the run's
    reject_late: bool = False  # fail a request whose TTFT deadline passed while it queued

    def __post_init__(self) -> None:
        RankedParams.__post_init__(self)
        at_least(0, ttft_slo_ms=self.ttft_slo_ms, tpot_slo_ms=self.tpot_slo_ms)
        if self.ttft_s() <= 0:
            slo = term("--slo ttft=500ms", "slo=['ttft=500ms']")
            arg = term("--strategy-arg ttft_slo_ms=500", "strategy_args={'ttft_slo_ms': 500}")
            raise ValueError(f"edf needs a TTFT SLO: {slo}, or {arg}")

    def ttft_s(self) -> float:
        """The TTFT SLO in seconds."""
        return self.ttft_slo_ms / 1000.0 if self.ttft_slo_ms else parse_slos(self.slo).get("ttft", 0.0)

    def tpot_s(self) -> float:
        """The TPOT SLO in seconds (0: none)."""
        return self.tpot_slo_ms / 1000.0 if self.tpot_slo_ms else parse_slos(self.slo).get("tpot", 0.0)


class EDF(Ranked):
    """Earliest deadline first, optionally failing requests that can no longer meet their TTFT SLO."""

    name: ClassVar[str] = "edf"
    Params: ClassVar[type] = EDFParams

    def __init__(self, params: EDFParams) -> None:
        super().__init__(params)
        self.ttft_s, self.tpot_s = params.ttft_s(), params.tpot_s()

    def key(self, request: RequestMsg, now: float) -> tuple:
        return (request.arrival_time + self.ttft_s + self.tpot_s * max(request.output_len - 1, 0),)

    def late(self, request: RequestMsg, now: float) -> bool:
        return self.params.reject_late and now > request.arrival_time + self.ttft_s


ORDERED: dict[str, type] = {"sjf": SJF, "edf": EDF}


def _normal(seed: int, request_id: int) -> float:
    """A standard normal draw fixed by (seed, request_id): splitmix64 → two uniforms → Box-Muller."""
    state = (seed * 0x9E3779B97F4A7C15 + request_id * 0xD1B54A32D192ED03) & _MASK
    u = []
    for _ in range(2):
        state = (state + 0x9E3779B97F4A7C15) & _MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        z ^= z >> 31
        u.append(((z >> 11) + 0.5) / 2.0**53)  # in (0, 1)
    return math.sqrt(-2.0 * math.log(u[0])) * math.cos(2.0 * math.pi * u[1])
