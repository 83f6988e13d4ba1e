"""Step models for today's GPUs: a datasheet roofline (worker.gpus) plus the terms an engine adds, fitted to
published measurements (benchmarks/gpu_fit.py; checked by benchmarks/gpu_validate.py, docs/simulator.md).

For a 16-bit model of N parameters, W weight bytes and kv KV bytes per token on a GPU of bandwidth B and dense
tensor rate F, with the terms below (η_mem, η_flop, c_step, c_row):

    decode step (r rows, C cached tokens) = c_step + r·(c_row + 2·V·h/(η_flop·F)) + kv·C/(η_mem·B)
                                            + max(W/(η_mem·B), r·2(N − V·h)/(η_flop·F))
    prefill (T tokens of r prompts, Σp²)  = c_step + r·(c_row + 2·V·h/(η_flop·F)) + Σp²·2·L·h/(η_flop·F)
                                            + max(W/(η_mem·B), T·2(N − V·h)/(η_flop·F))

The max is the roofline of the weight GEMMs: streaming the weights and computing with them overlap, so a small
batch costs the weight stream and a large one its arithmetic, not their sum (the sum overpredicted vLLM's CI
throughput runs by about 30%: docs/simulator.md). V·h is the LM head (a prefill computes it for each prompt's
last token only), 2·L·h per p² the causal attention, kv·C the KV cache a decode step reads.
c_step is the per-step fixed cost (CPU scheduling, kernel launches), c_row the per-row CPU work (sampling,
output processing): an engine version's terms, shared by every GPU. η_mem and η_flop, the achieved share of the
datasheet figures, belong to the GPU's die (worker.gpus: the H200 shares the H100's, the L4 the RTX 4090's) and
are shared by every engine, so a GPU no published run measured still gets a step model. An engine version whose
scheduler runs a step's prompts and decodes as separate forwards (`fused: false`) pays both; vLLM's V0 engine
(0.4.1 and 0.6.0, chunked prefill off: `prefill_alone`) runs them in separate steps, a step with waiting prompts
that fit running only them, and pages its KV pool, preempting the newest row when it runs out (worker.vllm_v0).
An engine's serving front end also costs CPU time per request (HTTP, tokenization) before the request reaches
the scheduler (`request_overhead_s`; with `front_end_blocks`, as in vLLM 0.4.1, whose server and engine share one
event loop, and in Lambda's vLLM 0.6.0 files, no step runs while it takes a burst in), and vLLM 0.6.0's
asynchronous output processing hands a prompt step's first tokens to the client only when the next prompt step
ends (`async_output`, simulator.published.delivered): the published replays (simulator.published) apply both;
neither is a step cost.

Presets are named GPU-MODEL-KIND, e.g. `rtx3090-mistral-7b-vllm`, for the backend kinds a grid's entries run
on (lab.simulate: `hf` static, `hf-loop`, `vllm`).
"""
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path

import yaml

from batchlab.models.archs import ARCHS, Arch, kv_bytes_per_token, n_params, weights_bytes
from batchlab.worker.gpus import GPU, GPUS, get_gpu

TERMS_FILE = Path(__file__).with_name("presets") / "gpu" / "engines.yaml"
MODELS = {"mistral-7b": "mistral-7b-v0.1", "llama-2-7b": "llama-2-7b", "llama-3.1-8b": "llama-3.1-8b",
          "tinyllama-1.1b": "tinyllama-1.1b"}  # preset name part -> models.archs name
KINDS = ("vllm", "hf", "hf-loop")
DTYPE_BYTES = 2  # the presets are 16-bit (bf16/fp16) models
HF_LOOP_STEP_TOKENS = 2048  # the HF continuous loop's per-step budget on CUDA (WorkerSettings.max_num_batched_tokens)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The share of the datasheet figures the kernels reach on one GPU die (shared by every engine)."""

    mem: float  # η_mem: of the bandwidth, streaming weights and KV
    flop: float  # η_flop: of the dense tensor rate, in the GEMMs


@dataclass(frozen=True, slots=True)
class EngineTerms:
    """What one engine (version) adds to a GPU's roofline; see the module docstring for the formula."""

    name: str
    step_overhead_s: float  # c_step: fixed cost of every step
    row_overhead_s: float  # c_row: CPU cost per row per step
    request_overhead_s: float = 0.0  # its HTTP front end's CPU time per request (serving, not offline)
    front_end_blocks: bool = False  # the front end and the engine share one event loop: no step while it ingests
    async_output: bool = False  # a prompt step's tokens reach the client one prompt step late (0.6.0's async output)
    step_tokens: int = 0  # the engine's default per-step token budget (0: prompts prefilled whole)
    padded: bool = False  # rows padded to the widest (HF) rather than packed (vLLM)
    fused: bool = True  # a step's decodes and prefill run as one forward
    prefill_alone: bool = False  # V0's scheduler: prompt-only steps, a paged KV pool, recompute (worker.vllm_v0)


@dataclass(frozen=True, slots=True)
class Terms:
    """A terms file: each GPU die's efficiency, each engine's terms, the engine each kind's presets play."""

    efficiency: dict[str, Efficiency]
    engines: dict[str, EngineTerms]
    presets: dict[str, str]


def engine_step_model(name: str, gpu: GPU, arch: Arch, terms: EngineTerms, eff: Efficiency) -> dict:
    """The step model (worker.stepmodel.StepModel's fields) of `arch` (16-bit) on `gpu` under an engine's `terms`
    and the GPU die's `eff`."""
    c = arch.config
    hidden, head = c["hidden_size"], c["vocab_size"] * c["hidden_size"]
    flops_s = eff.flop * gpu.bf16_flops
    n = n_params(arch)
    return dict(
        name=name, weights_bytes=float(weights_bytes(arch, DTYPE_BYTES)),
        kv_bytes_per_token=kv_bytes_per_token(arch, DTYPE_BYTES), bandwidth_Bps=eff.mem * gpu.bandwidth_Bps,
        prefill_s_per_token=0.0, overhead_s=terms.step_overhead_s, memory_bytes=gpu.memory_bytes,
        decode_s_per_row=terms.row_overhead_s + 2 * head / flops_s,
        prefill_s_per_row=terms.row_overhead_s + 2 * head / flops_s,
        prefill_s_per_token_pair=2 * c["num_hidden_layers"] * hidden / flops_s,
        gemm_s_per_token=2 * (n - head) / flops_s, padded=terms.padded, fused=terms.fused,
        step_tokens=terms.step_tokens, prefill_alone=terms.prefill_alone)


def load_terms(path: Path = TERMS_FILE) -> Terms:
    """A terms file (benchmarks/gpu_fit.py writes it); ValueError when it is not one."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        names = {f.name for f in fields(EngineTerms)} - {"name"}
        return Terms({k: Efficiency(float(v["mem"]), float(v["flop"])) for k, v in raw["efficiency"].items()},
                     {k: EngineTerms(k, **{n: v for n, v in spec.items() if n in names})
                      for k, spec in raw["engines"].items()}, dict(raw.get("presets") or {}))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"cannot read GPU engine terms {path}: {type(exc).__name__}: {exc}") from None


@cache
def shipped_terms() -> Terms:
    """The shipped terms file, read once."""
    return load_terms()


def step_model_for(name: str, gpu_key: str, model: str, engine: str, terms: Terms) -> dict:
    """The step model's fields of a models.archs `model` on a GPU under one engine of `terms`."""
    gpu = get_gpu(gpu_key)
    return engine_step_model(name, gpu, ARCHS[model], terms.engines[engine], terms.efficiency[gpu.chip])


def gpu_preset(name: str) -> dict | None:
    """The step model's fields of the preset GPU-MODEL-KIND (e.g. rtx3090-mistral-7b-vllm; worker.stepmodel.get_preset
    makes it a StepModel), or None when `name` is not of that form."""
    parts = parse_name(name)
    if parts is None:
        return None
    gpu, model, kind = parts
    terms = shipped_terms()
    engine = terms.engines[terms.presets[kind]]
    if kind == "hf-loop":  # the HF continuous loop: one forward a step, its own budget on CUDA
        engine = replace(engine, fused=True, step_tokens=HF_LOOP_STEP_TOKENS)
    gpu_spec = GPUS[gpu]
    return engine_step_model(name, gpu_spec, ARCHS[MODELS[model]], engine, terms.efficiency[gpu_spec.chip])


def parse_name(name: str) -> tuple[str, str, str] | None:
    """(gpu, model, kind) of a GPU preset's name, or None."""
    for kind in sorted(KINDS, key=len, reverse=True):  # hf-loop before hf
        if not name.endswith(f"-{kind}"):
            continue
        rest = name[: -len(kind) - 1]
        for gpu in GPUS:
            model = rest[len(gpu) + 1:] if rest.startswith(f"{gpu}-") else None
            if model in MODELS:
                return gpu, model, kind
    return None


def preset_kind(name: str) -> str | None:
    """The backend kind a GPU preset was made for (None: not a GPU preset)."""
    parts = parse_name(str(name))
    return parts[2] if parts else None


def preset_names() -> list[str]:
    """Every GPU preset's name."""
    return [f"{g}-{m}-{k}" for g in GPUS for m in MODELS for k in KINDS]


