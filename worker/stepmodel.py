"""Step-time models: how long one prefill or decode step of one model on one device takes.

Two forms, each term named and fitted (`batchlab calibrate`) or taken from a datasheet (the GPU presets):

    memory-bound (a GPU: the bandwidth model; a step streams the weights and the live KV cache)
        decode_step_s = overhead_s + weights_bytes / bandwidth_Bps + kv_bytes_per_token × context / bandwidth_Bps
        prefill_s     = prefill_overhead_s + weights_bytes / bandwidth_Bps + prefill_s_per_token × tokens
    with a GEMM term (the GPU presets, worker.gpu_presets) the weight stream becomes the roofline
        max(weights_bytes / bandwidth_Bps, tokens × gemm_s_per_token)   (tokens: decode rows, or prompt tokens)
    compute-bound (a CPU: cost grows with rows × hidden size, plus attention over the context)
        decode_step_s = overhead_s + decode_s_per_row × rows + decode_s_per_context_token × context
        prefill_s     = prefill_overhead_s + prefill_s_per_token × tokens + prefill_s_per_row × rows
                        + prefill_s_per_token_pair × Σ prompt_len²

Both are one formula: the terms a form does not use are 0 (bandwidth_Bps 0: no memory term).
`context` is the cached tokens the step's attention reads (all rows); `padded` says whether the worker
pads its rows to the widest (HF: generate()'s left padding, the slot cache's width) or packs them (vLLM),
so callers count padding as context when it is set; `fused` that a continuous step's decodes and prefill are
one forward (the HF slot loop), which pays the fixed cost once; `step_tokens` is the worker's per-step token
budget (its --max-num-batched-tokens), past which a continuous step prefills a prompt in chunks
(worker.sim.ContinuousCore); `prefill_alone` that the engine schedules as vLLM's V0 engine does (a step runs
the waiting prompts that fit alone, else every running row's decode; its KV pool is paged and a row is preempted
when it runs out: worker.vllm_v0.V0Core); `decode_rows_factor` what a decode step alone of few rows takes beyond
what the terms say (row_factor: a shape no linear term draws). A preset is a name in PRESETS or a YAML file.
`scaled` and `speed_factor` model a machine whose speed moves from run to run (a busy, shared one): every
step time of one run multiplied by one seeded factor.
"""
import functools
import hashlib
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from batchlab.models.archs import ARCHS, kv_bytes_per_token, n_params, weights_bytes

GB = 1e9


@dataclass(frozen=True, slots=True)
class StepModel:
    """Step times of one model on one device (seconds)."""

    name: str
    weights_bytes: float
    kv_bytes_per_token: int
    bandwidth_Bps: float  # 0: no memory-bound term (a compute-bound fit)
    prefill_s_per_token: float
    overhead_s: float = 0.0  # fixed cost of a decode step (and of a prefill unless prefill_overhead_s)
    memory_bytes: float = 0.0  # device memory, for the KV budget
    decode_s_per_row: float = 0.0  # rows × hidden size: the linear layers and the LM head, per row
    decode_s_per_context_token: float = 0.0  # attention over the cached context, per token (all rows)
    prefill_s_per_row: float = 0.0  # per prompt: its LM head and sampling
    prefill_s_per_token_pair: float = 0.0  # attention within a prompt: per prompt_len² (summed over rows)
    prefill_overhead_s: float | None = None  # None: overhead_s
    padded: bool = False  # rows padded to the widest (HF) rather than packed (vLLM)
    fused: bool = False  # a step's decodes and prefill run as one forward (the HF continuous loop): see fused_s
    step_tokens: int = 0  # a continuous step's token budget, decodes and prefill chunks (0: prompts prefilled whole)
    gemm_s_per_token: float = 0.0  # the roofline: GEMM compute per token (a decode row or a prompt token), see _gemm_s
    prefill_alone: bool = False  # vLLM V0's scheduling: prompt-only steps, a paged KV pool (worker.vllm_v0)
    decode_rows_factor: tuple[float, ...] = ()  # a decode step alone of r rows: factor[r − 1] × its terms

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode_rows_factor", tuple(map(float, self.decode_rows_factor)))  # a file's list

    def row_factor(self, rows: int) -> float:
        """How much longer than its terms say a decode step alone (no prompt in it) of `rows` rows takes: what
        the linear terms cannot draw, fitted from the runs' decode steps of each row count they held enough of
        (lab.calibrate_runs.row_factors; vLLM on the 2-core CPU: 13 ms for 1 row, 15 ms for 2, 11 ms for 4, 15 ms
        for 8); 1 past the table."""
        table = self.decode_rows_factor
        return table[rows - 1] if 0 < rows <= len(table) else 1.0

    def _streamed_s(self, nbytes: float) -> float:
        return nbytes / self.bandwidth_Bps if self.bandwidth_Bps > 0 else 0.0

    def _gemm_s(self, tokens: int) -> float:
        """The weights' part of a forward over `tokens` tokens: streaming them and computing with them overlap on a
        GPU, so it takes the larger of the two (the roofline), max(weights / bandwidth, tokens × gemm_s_per_token);
        with no GEMM term (every CPU fit) it is the weight stream alone."""
        return max(self._streamed_s(self.weights_bytes), tokens * self.gemm_s_per_token)

    def decode_step_s(self, context_tokens: int, rows: int = 1, alone: bool = True) -> float:
        """One decode step of `rows` rows over `context_tokens` cached tokens (all rows, padding included);
        `alone` False: the decodes' part of a step that also prefills (fused_s adds the prompts' part), which the
        row count's factor (row_factor, a decode step's own) leaves as its terms say."""
        terms = (self.overhead_s + self._gemm_s(rows) + self._streamed_s(self.kv_bytes_per_token * context_tokens)
                 + self.decode_s_per_row * rows + self.decode_s_per_context_token * context_tokens)
        return terms * self.row_factor(rows) if alone else terms

    def prefill_s(self, prompt_tokens: int, rows: int = 1, token_pairs: float | None = None) -> float:
        """Prefill of `rows` prompts, `prompt_tokens` tokens in all, in one forward pass (yields each row's
        first token); `token_pairs` = Σ prompt_len² (None: the rows are of equal length)."""
        if prompt_tokens <= 0:
            return 0.0
        rows = max(rows, 1)
        pairs = prompt_tokens * prompt_tokens / rows if token_pairs is None else token_pairs
        overhead = self.overhead_s if self.prefill_overhead_s is None else self.prefill_overhead_s
        return (overhead + self._gemm_s(prompt_tokens) + self.prefill_s_per_token * prompt_tokens
                + self.prefill_s_per_row * rows + self.prefill_s_per_token_pair * pairs)

    def fused_s(self, decode_s: float, prefill_s: float, decode_rows: int = 0, prefill_tokens: int = 0) -> float:
        """A continuous step with both decodes and a prefill: their sum, less (when `fused`) the fixed cost the
        one forward pays once: the smaller overhead and the weight stream. With a GEMM term the one forward's
        weights part is the roofline of all its tokens, max(weights / bandwidth, (decode_rows + prefill_tokens)
        × gemm_s_per_token), not the two parts' (each alone maybe compute-bound): the step's rows and prompt
        tokens say by how much."""
        if not (self.fused and decode_s and prefill_s):
            return decode_s + prefill_s
        prefill_overhead = self.overhead_s if self.prefill_overhead_s is None else self.prefill_overhead_s
        shared = min(self.overhead_s, prefill_overhead) + self._streamed_s(self.weights_bytes)
        one_forward = (self._gemm_s(decode_rows + prefill_tokens) - self._gemm_s(decode_rows)
                       - self._gemm_s(prefill_tokens) + self._streamed_s(self.weights_bytes))  # 0 without a GEMM term
        return decode_s + prefill_s - min(shared, decode_s, prefill_s) + one_forward

    def scaled(self, factor: float) -> "StepModel":
        """The same model with every step time multiplied by `factor` (> 1: a slower machine)."""
        if factor == 1.0:
            return self
        times = {name: getattr(self, name) * factor for name in TIME_TERMS}
        if self.prefill_overhead_s is not None:
            times["prefill_overhead_s"] = self.prefill_overhead_s * factor
        return replace(self, bandwidth_Bps=self.bandwidth_Bps / factor, **times)

    def kv_budget_bytes(self) -> int:
        """Device memory left for the KV cache after the weights (10% reserve)."""
        return max(0, int(0.9 * self.memory_bytes - self.weights_bytes))

    def as_dict(self) -> dict:
        """Plain dict (for hello facts, summaries and preset files)."""
        return asdict(self)


# StepModel's per-second terms (bandwidth_Bps and prefill_overhead_s are scaled apart: a rate, an optional)
TIME_TERMS = ("prefill_s_per_token", "overhead_s", "decode_s_per_row", "decode_s_per_context_token",
              "prefill_s_per_row", "prefill_s_per_token_pair", "gemm_s_per_token")


def speed_factor(sigma: float, *keys: object) -> float:
    """One run's step-time multiplier exp(σ·z), z ~ N(0, 1) drawn from a seed hashed from `keys` (the run's
    seed, repeat and label: the same run gets the same factor, two labels at one repeat different ones);
    1 when σ is 0."""
    if sigma <= 0:
        return 1.0
    digest = hashlib.sha256(repr(keys).encode()).digest()
    return math.exp(sigma * float(np.random.default_rng(int.from_bytes(digest[:8], "little")).standard_normal()))


def _on_gpu(name: str, arch: str, bandwidth_Bps: float, prefill_Fps: float, overhead_s: float,
            memory_bytes: float) -> StepModel:
    """A 16-bit model of models.archs on a GPU: weights and KV bytes from the architecture (so a preset and
    `--model ARCH:random` agree); prefill ≈ 2·N flops per token at `prefill_Fps` achieved flop/s."""
    a = ARCHS[arch]
    return StepModel(name, float(weights_bytes(a, 2)), kv_bytes_per_token(a, 2), bandwidth_Bps,
                     2 * n_params(a) / prefill_Fps, overhead_s, memory_bytes)


PRESETS: dict[str, StepModel] = {
    # The first two are the plain roofline, never checked against a GPU run; the GPU presets GPU-MODEL-KIND
    # (worker.gpu_presets, e.g. rtx3090-mistral-7b-vllm) are fitted to published runs and checked on others.
    # Llama-2-7B FP16 (6.74e9 params) on an A100-40GB: 1.555 TB/s HBM; prefill at ~50% of 312 TFLOP/s.
    "a100-llama2-7b": _on_gpu("a100-llama2-7b", "llama-2-7b", 1555 * GB, 156e12, 0.0005, 40 * GB),
    # Mistral-7B FP16 (7.24e9 params, GQA 8 KV heads) on an RTX 3090: 936 GB/s, 71 TFLOP/s fp16 dense.
    "3090-mistral-7b": _on_gpu("3090-mistral-7b", "mistral-7b-v0.1", 936 * GB, 35e12, 0.0008, 24 * GB),
    # No model at all: the harness alone (the echo backend).
    "echo": StepModel("echo", 0.0, 0, 1.0, 0.0, 0.0, 1e12),
}
PRESET_SUFFIXES = (".yaml", ".yml")
# Presets shipped as files (worker/presets/NAME.yaml, with their calibration record): tiny-mistral on a 2-core
# CPU as `batchlab calibrate --from` fitted it to live runs' steps, one per backend kind: cpu-tiny-mistral
# (HF static), cpu-tiny-mistral-loop (the HF continuous loop), cpu-tiny-mistral-vllm.
PRESET_DIR = Path(__file__).with_name("presets")


def load_preset(path: str | Path) -> StepModel:
    """A preset file (`batchlab calibrate --out`): StepModel's fields at the top level; other keys (the
    calibration's record) are ignored. ValueError when a field is missing or unknown to StepModel."""
    import yaml

    try:
        values = dict(_model_fields(Path(path).read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read sim preset {str(path)!r}: {exc}") from None
    values.setdefault("name", Path(path).stem)
    try:
        return StepModel(**values)
    except TypeError as exc:
        raise ValueError(f"sim preset {str(path)!r} is not a step model: {exc}") from None


@functools.lru_cache(maxsize=32)
def _model_fields(text: str) -> tuple[tuple[str, object], ...]:
    """A preset file's StepModel fields, by its text: parsed once (a twin's search and curves read the same file
    for each of their ~130 simulated runs; a fitted continuous preset, 17 kB with its calibration record, takes
    60 ms to parse)."""
    import yaml

    raw = yaml.safe_load(text) or {}
    names = {f.name for f in fields(StepModel)}
    return tuple((k, v) for k, v in raw.items() if k in names) if isinstance(raw, dict) else ()


def save_preset(model: StepModel, path: str | Path, record: dict | None = None) -> None:
    """Write `model` as a preset file that get_preset(path) reads back; `record` goes under `calibration`."""
    from batchlab.protocol.files import yaml_text

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    body = {**model.as_dict(), **({"calibration": record} if record else {})}
    Path(path).write_text(yaml_text(body))


def get_preset(name: str) -> StepModel:
    """A preset by name (PRESETS, a file shipped in PRESET_DIR, or a GPU preset GPU-MODEL-KIND of
    worker.gpu_presets) or a preset file's path (.yaml/.yml), or ValueError naming the choices."""
    from batchlab.worker.gpu_presets import gpu_preset  # the GPUs' table and terms: read when a name asks

    if name in PRESETS:
        return PRESETS[name]
    if (PRESET_DIR / f"{name}.yaml").is_file():
        return load_preset(PRESET_DIR / f"{name}.yaml")
    if str(name).endswith(PRESET_SUFFIXES) or Path(name).is_file():
        return load_preset(name)
    on_gpu = gpu_preset(str(name))
    if on_gpu is not None:
        return StepModel(**on_gpu)
    names = [*PRESETS, *sorted(f.stem for f in PRESET_DIR.glob("*.yaml"))]  # PRESETS' and the shipped files'
    raise ValueError(f"unknown sim preset {name!r} (choose from {', '.join(names)}, a GPU preset GPU-MODEL-KIND "
                     f"such as rtx3090-mistral-7b-vllm (docs/simulator.md), or a preset file's path)")
