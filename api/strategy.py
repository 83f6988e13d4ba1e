"""Everything a batching strategy of your own needs, in one module.

A strategy is a small pure class: it is shown the queue (Request: id, planned arrival time, prompt and output
lengths), the time it is given and one worker's room (Capacity), and answers with a Decision: launch these
now (with a reason), fail these, or wake me at t. It opens no socket and reads no clock. Subclass Policy, set
`mode` ("static": whole batches; "continuous": requests join at step boundaries) and write `decide`:

    from batchlab.api.strategy import Capacity, Decision, Policy

    class Fifo4(Policy):
        mode = "static"

        def decide(self, queue, now, cap, end_of_stream):
            n = min(4, len(queue), cap.free_slots)
            return Decision(n, "size") if n == 4 or (n and end_of_stream) else Decision()

Give it by name (`package.module:Class`, an installed `batchlab.strategies` entry point) or, from Python, as
the class itself: api.run({..., "strategy": Fifo4}). A class defined in a notebook travels to the scheduler's
process by value. Parameters: a `Params` dataclass (typed fields with defaults) is built from the run's
strategy_args and reachable as self.params; a field named like a run setting (max_batch_size, max_wait_ms,
max_new_tokens, batch_size, seed, slo) takes that setting's value when the run gives it, else keeps its own
default. docs/strategies.md has the rules; the built-ins below are the examples.
"""
from batchlab.protocol.messages import RequestMsg as Request
from batchlab.scheduler.ordered import EDF, SJF
from batchlab.scheduler.policies import (AdaptiveCap, Capacity, Continuous, Decision, Dynamic, Naive, Policy, at_least,
                                         fit_padded)
from batchlab.scheduler.strategies import MODES, load_class

__all__ = ["Policy", "Decision", "Capacity", "Request", "MODES", "check", "at_least", "fit_padded", "AdaptiveCap",
           "Naive", "Dynamic", "Continuous", "SJF", "EDF"]


def check(cls: type) -> type:
    """`cls` when it is a strategy batchlab can run (name, mode, decide, on_batch_done; a dataclass Params if any;
    built from its defaults where it can be, its decide answers an empty queue), else ConfigError saying what it
    lacks or what raised: the check a run makes before it starts."""
    from batchlab.protocol.errors import ConfigError
    from batchlab.protocol.settings import RunConfig
    from batchlab.scheduler.strategies import check_decides, resolve, typed_args

    typed_args(load_class(cls), {})
    try:
        strategy = resolve(RunConfig(strategy=cls))
    except ConfigError:  # its parameters need a run's settings (edf: an SLO): its run checks decide
        return cls
    check_decides(strategy)
    return cls
