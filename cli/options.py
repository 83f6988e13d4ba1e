"""Command-line option types shared by the batchlab commands (Annotated, keyword-only)."""
from typing import Annotated, Optional

import typer

Opt = typer.Option
ConfigOpt = Annotated[Optional[str], Opt("--config", help="YAML file of settings (options override it)")]
Strategy = Annotated[Optional[str], Opt(help="naive | dynamic | continuous | vllm")]
Backend = Annotated[Optional[str], Opt(help="sim | echo | hf | vllm | openai")]
Model = Annotated[Optional[str], Opt(help="tiny-mistral (default), a hub id or a local path")]
Preset = Annotated[Optional[str], Opt(help="sim step-time preset (a100-llama2-7b, 3090-mistral-7b, cpu-tiny-mistral)")]
Rate = Annotated[Optional[float], Opt(help="arrival rate, requests/s")]
Duration = Annotated[Optional[float], Opt("--duration", help="seconds of traffic")]
Arrival = Annotated[Optional[str], Opt(help="poisson | gamma | constant")]
Burst = Annotated[Optional[float], Opt(help="gamma shape: 1 = Poisson, < 1 burstier")]
Dataset = Annotated[Optional[str], Opt(help="sharegpt | synthetic | PATH (ShareGPT JSON/JSONL)")]
Schedule = Annotated[Optional[str], Opt(help="replay this saved schedule.parquet")]
BatchSize = Annotated[Optional[int], Opt(help="naive: launch exactly N")]
MaxBatch = Annotated[Optional[int], Opt(help="dynamic: size trigger / worker rows")]
MaxWait = Annotated[Optional[float], Opt(help="dynamic: age trigger, ms")]
MaxNew = Annotated[Optional[int], Opt(help="cap on output tokens per request")]
MaxPrompt = Annotated[Optional[int], Opt(help="drop prompts longer than this many tokens")]
Seed = Annotated[Optional[int], Opt(help="seed of the arrival and prompt streams")]
Out = Annotated[Optional[str], Opt(help="output folder")]
SloOpt = Annotated[Optional[list[str]], Opt("--slo", help="SLO for goodput in summary.json, e.g. ttft=500ms "
                                                          "(repeatable; names ttft, tpot, e2e, queue_wait)")]
Workers = Annotated[Optional[int], Opt(help="worker processes (the scheduler waits for this many)")]
MaxQueue = Annotated[Optional[int], Opt(help="reject arrivals beyond this queue length (0: unbounded)")]
MaxQueueTok = Annotated[Optional[int], Opt(help="reject arrivals beyond this many queued tokens (0: unbounded)")]
Budget = Annotated[Optional[str], Opt(help="KV memory budget, e.g. 2GiB (default: the backend's)")]
Strict = Annotated[Optional[bool], Opt("--strict-memory", help="treat a batch over budget as OOM (CPU)")]
Dtype = Annotated[Optional[str], Opt(help="auto | float32 | float16 | bfloat16")]
Device = Annotated[Optional[str], Opt(help="auto | cpu | cuda")]
Endpoint = Annotated[Optional[str], Opt(help="openai backend: server URL")]
MaxConc = Annotated[Optional[int], Opt(help="openai backend: concurrent streams")]
GpuUtil = Annotated[Optional[float], Opt(help="vllm: fraction of GPU memory for the engine")]
MaxSeqs = Annotated[Optional[int], Opt(help="vllm: max running sequences (0: --max-batch-size)")]
MaxTok = Annotated[Optional[int], Opt(help="vllm: max tokens per engine step (0: vLLM's default)")]
Eager = Annotated[Optional[bool], Opt("--enforce-eager", help="vllm: no CUDA graphs / torch.compile")]
TP = Annotated[Optional[int], Opt(help="vllm: tensor-parallel GPUs")]
PP = Annotated[Optional[int], Opt(help="vllm: pipeline-parallel stages")]
Keys = Annotated[Optional[str], Opt(help="CurveZMQ key folder (needed to bind a non-loopback address)")]

