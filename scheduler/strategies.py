"""The run's strategy resolved once: its policy, the worker mode it needs and the rows a worker runs.

Everything that needs to know the strategy asks here: the scheduler builds its policy, the front end
tells each worker its mode and row cap (a worker never reads the strategy's name), the simulator does
both.
"""
from collections.abc import Callable
from dataclasses import dataclass

from batchlab.protocol.settings import ConfigError, RunConfig
from batchlab.scheduler.policies import Policy, make_policy


@dataclass(frozen=True, slots=True)
class Strategy:
    """A resolved strategy: `policy()` builds a fresh policy (one per run)."""

    name: str
    mode: str  # "static" (batch at a time) or "continuous" (join at step boundaries)
    rows: int  # the most rows a worker runs at once: its hello's max_batch_size
    build: Callable[[], Policy]

    def policy(self) -> Policy:
        """A new policy object with this run's parameters."""
        return self.build()


def resolve(cfg: RunConfig) -> Strategy:
    """cfg's strategy, or ConfigError naming what is wrong."""

    def build() -> Policy:
        return make_policy(cfg.strategy, batch_size=cfg.batch_size, max_batch_size=cfg.max_batch_size,
                           max_wait_ms=cfg.max_wait_ms, max_new_tokens=cfg.max_new_tokens)

    try:
        policy = build()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Strategy(policy.name, policy.mode, int(getattr(policy, "rows", cfg.max_batch_size)), build)
