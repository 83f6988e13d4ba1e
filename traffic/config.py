"""What a traffic run is: its arrival process, rate, length and prompt source."""
import dataclasses
import math
from dataclasses import dataclass, field

from batchlab.traffic.arrivals import ARRIVAL_KINDS
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.traces import BUILTIN_TRACES, is_trace_dataset

TRACE_ARRIVAL = "trace"  # the trace's own arrival times (a trace dataset only)


def default_output_lengths() -> LengthSpec:
    return LengthSpec(dist="uniform", mean=128, min=16, max=256)


@dataclass(slots=True)
class TrafficConfig:
    """Everything that determines a schedule; same config (and tokenizer) => same schedule."""

    arrival: str  # "poisson" | "gamma" | "constant" | "trace"
    rate: float  # mean requests/s; with arrival "trace", 0 keeps the trace's own rate
    duration_s: float  # arrivals are planned in [0, duration_s)
    burstiness: float = 1.0  # gamma shape; 1 = Poisson, smaller = burstier
    seed: int = 0
    # "sharegpt" | "synthetic" | path to a ShareGPT JSON / JSONL file | a trace: "azure-conv",
    # "azure-code", "trace:PATH" or a .csv / trace .jsonl PATH (traffic/traces.py)
    dataset: str = "sharegpt"
    max_new_tokens: int = 128  # output_len cap
    max_prompt_len: int = 1024  # longer prompts are dropped (ShareGPT) or cut (synthetic, traces)
    min_prompt_len: int = 4  # shorter prompts are dropped (ShareGPT) or raised (synthetic); traces keep theirs
    prompt_lengths: LengthSpec = field(default_factory=LengthSpec)  # synthetic only
    output_lengths: LengthSpec = field(default_factory=default_output_lengths)  # synthetic only
    vocab_size: int = 32000  # synthetic token ids are drawn below this
    trace_start_s: float = 0.0  # traces: the run starts this many seconds after the trace's first request
    num_requests: int = 0  # at most this many requests (the first ones); 0: all of duration_s

    def check(self) -> None:
        """ValueError with a clear message for settings that cannot make a schedule."""
        if not 1 <= self.min_prompt_len <= self.max_prompt_len:
            raise ValueError(f"need 1 <= min_prompt_len <= max_prompt_len, got "
                             f"{self.min_prompt_len} and {self.max_prompt_len}")
        if self.num_requests < 0:
            raise ValueError(f"num_requests must be >= 0 (0: no count limit), got {self.num_requests}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self._check_trace()
        if self.dataset == "synthetic":
            self.prompt_lengths.check("synthetic prompt lengths")
            self.output_lengths.check("synthetic output lengths")

    def _check_trace(self) -> None:
        """The trace settings: arrival "trace" needs a trace; rate 0 only with it; a start >= 0."""
        if self.arrival not in (*ARRIVAL_KINDS, TRACE_ARRIVAL):
            raise ValueError(f"unknown arrival kind {self.arrival!r}; expected one of "
                             f"{', '.join((*ARRIVAL_KINDS, TRACE_ARRIVAL))}")
        if self.arrival == TRACE_ARRIVAL and not is_trace_dataset(self.dataset):
            raise ValueError(f"arrival 'trace' replays a trace's own timing, and dataset {self.dataset!r} is "
                             f"no trace: use {', '.join(BUILTIN_TRACES)}, trace:PATH or a .csv trace")
        if self.arrival == TRACE_ARRIVAL and not (self.rate >= 0 and math.isfinite(self.rate)):
            raise ValueError(f"with arrival 'trace', rate must be >= 0 requests/s (0: the trace's own), "
                             f"got {self.rate!r}")
        if not (self.trace_start_s >= 0 and math.isfinite(self.trace_start_s)):
            raise ValueError(f"trace_start_s must be >= 0 s, got {self.trace_start_s!r}")

    def to_dict(self) -> dict:
        """Plain JSON-able dict (nested length specs become dicts)."""
        return dataclasses.asdict(self)

    def settings(self) -> dict:
        """to_dict with the length specs in their one-line text form (lengths.py), as a run's settings
        hold them (YAML `prompt_lengths: 128`)."""
        data = self.to_dict()
        data.update(prompt_lengths=self.prompt_lengths.text(), output_lengths=self.output_lengths.text())
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TrafficConfig":
        """Inverse of to_dict."""
        data = dict(data)
        for key in ("prompt_lengths", "output_lengths"):
            if isinstance(data.get(key), dict):
                data[key] = LengthSpec(**data[key])
        return cls(**data)
