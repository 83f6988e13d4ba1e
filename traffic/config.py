"""What a traffic run is: its arrival process, rate, length and prompt source."""
import dataclasses
import math

from pydantic import Field, InstanceOf

from batchlab.protocol.setting_groups import ScheduleSettings
from batchlab.traffic.lengths import LengthSpec
from batchlab.traffic.traces import BUILTIN_TRACES, is_trace_dataset

TRACE_ARRIVAL = "trace"  # the trace's own arrival times (a trace dataset only)


def default_output_lengths() -> LengthSpec:
    return LengthSpec(dist="uniform", mean=128, min=16, max=256)


class TrafficConfig(ScheduleSettings):
    """Everything that determines a schedule (a run's schedule settings, protocol.setting_groups, with the
    lengths parsed and the prompt source's limits); same config (and tokenizer) => same schedule."""

    min_prompt_len: int = Field(4, ge=1)  # shorter prompts: dropped (ShareGPT), raised (synthetic); traces keep theirs
    prompt_lengths: InstanceOf[LengthSpec] = Field(default_factory=LengthSpec)  # synthetic only
    output_lengths: InstanceOf[LengthSpec] = Field(default_factory=default_output_lengths)  # synthetic only
    vocab_size: int = Field(32000, ge=1)  # synthetic token ids are drawn below this

    def check(self) -> None:
        """ValueError with a clear message for settings that cannot make a schedule."""
        if not self.min_prompt_len <= self.max_prompt_len:
            raise ValueError(f"need 1 <= min_prompt_len <= max_prompt_len, got "
                             f"{self.min_prompt_len} and {self.max_prompt_len}")
        # arrival "trace" needs a trace, and a finite rate >= 0 (0: its own)
        if self.arrival == TRACE_ARRIVAL and not is_trace_dataset(self.dataset):
            raise ValueError(f"arrival 'trace' replays a trace's own timing, and dataset {self.dataset!r} is "
                             f"no trace: use {', '.join(BUILTIN_TRACES)}, trace:PATH or a .csv trace")
        if self.arrival == TRACE_ARRIVAL and not (self.rate >= 0 and math.isfinite(self.rate)):
            raise ValueError(f"with arrival 'trace', rate must be >= 0 requests/s (0: the trace's own), "
                             f"got {self.rate!r}")
        if self.dataset == "synthetic":
            self.prompt_lengths.check("synthetic prompt lengths")
            self.output_lengths.check("synthetic output lengths")

    def to_dict(self) -> dict:
        """Plain JSON-able dict (nested length specs become dicts)."""
        return {**self.model_dump(), "prompt_lengths": dataclasses.asdict(self.prompt_lengths),
                "output_lengths": dataclasses.asdict(self.output_lengths)}

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
