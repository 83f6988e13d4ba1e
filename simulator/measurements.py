"""Published GPU measurements: the file that holds them and what one configuration is.

A measurement file (YAML; benchmarks/published/measurements.yaml is the shipped one, its README says where each
figure was read) holds named request samples and configurations. A configuration is one published run: its
source, engine and version, GPU, model and dtype, its workload (fixed lengths, published per-request lengths, or
a named sample rescaled to the published mean lengths, or fixed prompts with outputs spread evenly over a
range), how the requests arrived (`batch`: all at t = 0;
`closed`: N clients, each sending its next request when its last one ended, vLLM's --max-concurrency; `open`:
Poisson arrivals at a rate), the engine settings that matter (max running rows, per-step token budget, KV
blocks), the published figures, and whether the configuration is in the fit set or the held-back check set.
simulator.published replays them.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from batchlab.models.archs import ARCHS
from batchlab.protocol.errors import PublishedError
from batchlab.worker.gpus import get_gpu

# metric -> the group its error is counted in (throughput, TPOT/ITL, TTFT: the three)
GROUPS = {"throughput_req_s": "throughput", "throughput_out_tok_s": "throughput",
          "tpot_median_s": "tpot", "tpot_mean_s": "tpot", "batch_latency_s": "tpot",
          "ttft_median_s": "ttft", "ttft_mean_s": "ttft"}
SPLITS = ("fit", "check")
LOADS = ("batch", "closed", "open")


@dataclass(slots=True)
class PublishedFigure:
    """One published figure: the metric, its value (s, req/s or tok/s) and where in the source it is."""

    metric: str
    value: float
    where: str
    scored: bool = True  # counted in the error summary (one figure per group per configuration)


@dataclass(slots=True)
class Measurement:
    """One published configuration (see the module docstring)."""

    id: str
    source: str
    link: str
    engine: str  # engine and version as the source states them
    terms: str  # the engine-terms key (worker/presets/gpu-engines.yaml) its version plays
    gpu: str
    model: str  # models.archs name
    dtype: str
    split: str
    load: str
    prompts: list[int]
    outputs: list[int]  # 0: the source recorded no output token (counted with TTFT 0, as it did)
    concurrency: int = 0
    rate: float = math.inf
    seed: int = 0
    max_num_seqs: int = 256
    step_tokens: int = 0  # the run's per-step token budget (0: the engine terms' default)
    kv_tokens: int = 0  # KV cache size the source reports (0: the GPU's memory less the weights)
    serving: bool = True  # through the engine's HTTP server (its front end's per-request cost); False: offline
    figures: list[PublishedFigure] = field(default_factory=list)
    notes: str = ""


# --- reading a measurement file -------------------------------------------------------------------------
def load_measurements(path: str | Path) -> list[Measurement]:
    """Every configuration of a measurement file; PublishedError naming the first bad one."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PublishedError(f"cannot read measurements {path}: {exc}") from None
    samples = raw.get("samples") or {}
    sources = {s["id"]: s for s in raw.get("sources") or []}
    out = []
    for spec in raw.get("configurations") or []:
        try:
            out.append(_measurement(spec, sources[spec["source"]], samples))
        except (KeyError, TypeError, ValueError) as exc:
            raise PublishedError(f"{path}: configuration {spec.get('id', '?')!r}: {type(exc).__name__}: {exc}") \
                from None
    return out


def _measurement(spec: dict, source: dict, samples: dict) -> Measurement:
    prompts, outputs = _workload(spec["workload"], samples)
    load = spec["load"]
    m = Measurement(
        spec["id"], source["title"], source["link"], spec.get("engine", source.get("engine", "")),
        spec.get("terms", source.get("terms", "")), spec.get("gpu", source.get("gpu", "")),
        spec.get("model", source.get("model", "")), spec.get("dtype", source.get("dtype", "")), spec["split"],
        load["mode"], prompts, outputs, int(load.get("concurrency", 0)), float(load.get("rate", math.inf)),
        int(load.get("seed", 0)), int(spec.get("max_num_seqs", source.get("max_num_seqs", 256))),
        int(spec.get("step_tokens", source.get("step_tokens", 0))), int(spec.get("kv_tokens", 0)),
        bool(source.get("serving", True)),
        [PublishedFigure(f["metric"], float(f["value"]), f.get("where", ""), bool(f.get("scored", True)))
         for f in spec["figures"]],
        spec.get("notes", ""))
    _check(m)
    return m


def _workload(spec: dict, samples: dict) -> tuple[list[int], list[int]]:
    """(prompt lengths, output lengths) of a workload spec: fixed, per request, or a rescaled named sample."""
    if "fixed" in spec:
        f = spec["fixed"]
        return [int(f["prompt"])] * int(f["count"]), [int(f["output"])] * int(f["count"])
    if "spread" in spec:  # fixed prompts; outputs evenly spread over [min, max], in a seeded order
        f = spec["spread"]
        outputs = np.rint(np.linspace(float(f["output_min"]), float(f["output_max"]), int(f["count"]))).astype(int)
        return [int(f["prompt"])] * int(f["count"]), np.random.default_rng(int(f.get("seed", 0))).permutation(
            outputs).tolist()
    if "lengths" in spec:
        return [int(p) for p in spec["lengths"]["prompts"]], [int(o) for o in spec["lengths"]["outputs"]]
    s = spec["sample"]
    base = samples[s["name"]]
    count = int(s["count"])
    prompts = np.resize(np.asarray(base["prompts"], dtype=float), count)  # cycles past the sample's end
    outputs = np.resize(np.maximum(np.asarray(base["outputs"], dtype=float), 1), count)
    if "prompt_mean" in s:
        prompts *= float(s["prompt_mean"]) / prompts.mean()
    if "output_mean" in s:
        outputs *= float(s["output_mean"]) / outputs.mean()
    return np.maximum(np.rint(prompts), 1).astype(int).tolist(), np.maximum(np.rint(outputs), 1).astype(int).tolist()


def _check(m: Measurement) -> None:
    rules = [(m.split in SPLITS, f"split must be one of {SPLITS}"), (m.load in LOADS, f"load must be one of {LOADS}"),
             (m.model in ARCHS, f"unknown model {m.model!r}"), (len(m.prompts) == len(m.outputs) > 0, "no requests"),
             (m.load != "closed" or m.concurrency > 0, "a closed loop needs its concurrency"),
             (m.load != "open" or 0 < m.rate < math.inf, "an open loop needs a finite rate"),
             (all(f.metric in GROUPS for f in m.figures), f"metrics must be among {sorted(GROUPS)}"),
             (all(f.value > 0 for f in m.figures), "every figure must be > 0")]
    get_gpu(m.gpu)
    for ok, why in rules:
        if not ok:
            raise ValueError(why)
