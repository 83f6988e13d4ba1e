"""What a traffic run is: its arrival process, rate, length and prompt source."""
import dataclasses
from dataclasses import dataclass, field

from batchlab.traffic.datasets import LengthSpec


def _default_output_lengths() -> LengthSpec:
    return LengthSpec(dist="uniform", mean=128, min=16, max=256)


@dataclass(slots=True)
class TrafficConfig:
    """Everything that determines a schedule; same config (and tokenizer) => same schedule."""

    arrival: str  # "poisson" | "gamma" | "constant"
    rate: float  # mean requests/s
    duration_s: float  # arrivals are planned in [0, duration_s)
    burstiness: float = 1.0  # gamma shape; 1 = Poisson, smaller = burstier
    seed: int = 0
    dataset: str = "sharegpt"  # "sharegpt" | "synthetic" | path to a ShareGPT JSON / JSONL file
    max_new_tokens: int = 128  # output_len cap
    max_prompt_len: int = 1024  # longer prompts are dropped (ShareGPT) or clipped (synthetic)
    min_prompt_len: int = 4  # shorter prompts are dropped (ShareGPT) or clipped (synthetic)
    prompt_lengths: LengthSpec = field(default_factory=LengthSpec)  # synthetic only
    output_lengths: LengthSpec = field(default_factory=_default_output_lengths)  # synthetic only
    vocab_size: int = 32000  # synthetic token ids are drawn below this

    def check(self) -> None:
        """ValueError with a clear message for settings that cannot make a schedule."""
        if not 1 <= self.min_prompt_len <= self.max_prompt_len:
            raise ValueError(f"need 1 <= min_prompt_len <= max_prompt_len, got "
                             f"{self.min_prompt_len} and {self.max_prompt_len}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.dataset == "synthetic":
            self.prompt_lengths.check("synthetic prompt lengths")
            self.output_lengths.check("synthetic output lengths")

    def to_dict(self) -> dict:
        """Plain JSON-able dict (nested length specs become dicts)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrafficConfig":
        """Inverse of to_dict."""
        data = dict(data)
        for key in ("prompt_lengths", "output_lengths"):
            if isinstance(data.get(key), dict):
                data[key] = LengthSpec(**data[key])
        return cls(**data)
