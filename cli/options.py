"""Command-line option types shared by the batchlab commands (Annotated, keyword-only).

A flag shown as <bool> also takes a value (`--strict-memory true`, cli.grammar). A run setting's option defaults to None, meaning "not given" (a YAML file's value then stands); its help
shows the default RunConfig holds, read from RunConfig itself so the two cannot drift.
"""
from dataclasses import MISSING, fields
from typing import Annotated, Optional

import typer
from typer.models import OptionInfo

from batchlab.protocol.settings import RunConfig

Opt = typer.Option
DEFAULTS = {f.name: f.default for f in fields(RunConfig) if f.default is not MISSING}


def shown_default(setting: str) -> str | bool:
    """RunConfig's default for `setting` as --help shows it (False: nothing to show, e.g. '')."""
    value = DEFAULTS.get(setting)
    if isinstance(value, bool):
        return str(value).lower()
    return False if value in (None, "") else str(value)


def setting(name: str, *decls: str, help: str) -> OptionInfo:
    """The option for RunConfig.<name>: not given by default, RunConfig's default shown in --help."""
    return Opt(*decls, help=help, show_default=shown_default(name))


ConfigOpt = Annotated[Optional[str], Opt("--config", help="YAML file of settings (options override it)")]
Strategy = Annotated[Optional[str], setting(
    "strategy", help="naive | dynamic | continuous | sjf | edf | vllm, an installed plugin's name, "
                     "or package.module:Class")]
StrategyArgs = Annotated[Optional[list[str]], Opt(
    "--strategy-arg", help="a strategy parameter, KEY=VALUE (repeatable); a parameter named like an option "
                           "(e.g. max_batch_size) defaults to that option's value")]
Backend = Annotated[Optional[str], setting("backend", help="sim | echo | hf | vllm | openai")]
Model = Annotated[Optional[str], setting("model", help="a hub id or a local path")]
Preset = Annotated[Optional[str], setting(
    "preset", help="sim step-time preset (a100-llama2-7b, 3090-mistral-7b, cpu-tiny-mistral) or a file "
                   "batchlab calibrate wrote")]
Rate = Annotated[Optional[float], setting(
    "rate", help="arrival rate, requests/s; inf: all at t = 0 (with --arrival trace: rescale to this mean rate, "
                 "keeping the burst shape; 0 or not given: the trace's own timing)")]
Duration = Annotated[Optional[float], setting(
    "duration_s", "--duration", help="seconds of traffic (with --num-requests: whichever stop comes first)")]
NumRequests = Annotated[Optional[int], setting(
    "num_requests", "--num-requests", help="stop after N requests or --duration, whichever comes first "
                                           "(no --duration: N alone; 0: --duration alone)")]
Concurrency = Annotated[Optional[int], setting(
    "concurrency", help="closed loop: N clients, each sends its next request when its last one ended (plus "
                        "--think-time-ms); not with --rate/--arrival (docs/traffic.md)")]
ThinkTime = Annotated[Optional[float], setting(
    "think_time_ms", "--think-time-ms", help="closed loop: a client waits this long after an end, ms")]
Arrival = Annotated[Optional[str], setting(
    "arrival", help="poisson | gamma | constant | trace (a trace dataset's own arrival times)")]
TraceStart = Annotated[Optional[float], setting(
    "trace_start_s", "--trace-start", help="traces: start this many seconds after the trace's first request")]
PromptLens = Annotated[Optional[str], setting(
    "prompt_lengths", help="synthetic prompt lengths: 128 | 32-512 | 64,128,256 | lognormal:mean=256 (default 32-512)")]
OutputLens = Annotated[Optional[str], setting(
    "output_lengths", help="synthetic output lengths, same forms (default 16-256; capped by --max-new-tokens)")]
Burst = Annotated[Optional[float], setting("burstiness", help="gamma shape: 1 = Poisson, < 1 burstier")]
Dataset = Annotated[Optional[str], setting(
    "dataset", help="sharegpt | synthetic | azure-conv | azure-code (Azure LLM inference trace 2023) | "
                    "trace:PATH (CSV/JSONL: timestamp, input length, output length) | PATH (ShareGPT JSON/JSONL)")]
Schedule = Annotated[Optional[str], setting("schedule", help="replay this saved schedule.parquet")]
BatchSize = Annotated[Optional[int], setting("batch_size", help="naive: launch exactly N")]
MaxBatch = Annotated[Optional[int], setting("max_batch_size", help="dynamic, continuous: size cap / worker rows")]
MaxWait = Annotated[Optional[float], setting("max_wait_ms", help="dynamic: age trigger, ms")]
MaxNew = Annotated[Optional[int], setting("max_new_tokens", help="cap on output tokens per request")]
MaxPrompt = Annotated[Optional[int], setting("max_prompt_len", help="drop prompts longer than this many tokens")]
Seed = Annotated[Optional[int], setting("seed", help="seed of the arrival and prompt streams")]
Out = Annotated[Optional[str], Opt(help="output folder (run: a new runs/<date>-<strategy>-<backend> unless given; "
                                           "the roles alone: runs/latest)")]
Overwrite = Annotated[bool, Opt("--overwrite", help="replace what --out holds (else a used folder is refused)")]
SLO_HELP = ("SLOs for goodput, NAME=VALUE[ms|s|us], a comma list or repeated (e.g. ttft=1s,tpot=50ms); names "
            "ttft, tpot, e2e, queue_wait; a value without a unit is in ms")
SloOpt = Annotated[Optional[list[str]], Opt("--slo", help=SLO_HELP)]
Workers = Annotated[Optional[int], setting("workers", help="worker processes (the scheduler waits for this many)")]
MaxQueue = Annotated[Optional[int], setting("max_queue", help="reject arrivals beyond this queue length (0: unbounded)")]
MaxQueueTok = Annotated[Optional[int], setting(
    "max_queue_tokens", help="reject arrivals beyond this many queued tokens (0: unbounded)")]
Budget = Annotated[Optional[str], setting("memory_budget", help="KV memory budget, e.g. 2GiB (default: the backend's)")]
Strict = Annotated[Optional[bool], setting("strict_memory", "--strict-memory/--no-strict-memory",
                                           help="treat a batch over budget as OOM (CPU)")]
Dtype = Annotated[Optional[str], setting("dtype", help="auto | float32 | float16 | bfloat16")]
Device = Annotated[Optional[str], setting("device", help="auto | cpu | cuda")]
Endpoint = Annotated[Optional[str], setting("endpoint", help="openai backend: server URL")]
MaxConc = Annotated[Optional[int], setting("max_concurrency", help="openai backend: concurrent streams")]
GpuUtil = Annotated[Optional[float], setting("gpu_memory_utilization",
                                             help="vllm: fraction of GPU memory for the engine")]
MaxSeqs = Annotated[Optional[int], setting("max_num_seqs", help="vllm: max running sequences (0: --max-batch-size)")]
MaxTok = Annotated[Optional[int], setting("max_num_batched_tokens",
                                          help="tokens per engine step, decodes and prompt chunks together "
                                               "(0: vLLM's default; hf continuous: 256 on CPU, 2048 on CUDA); "
                                               "not below --max-batch-size")]
Eager = Annotated[Optional[bool], setting("enforce_eager", "--enforce-eager/--no-enforce-eager",
                                          help="vllm: no CUDA graphs / torch.compile")]
Compile = Annotated[Optional[bool], setting(
    "torch_compile", "--torch-compile/--no-torch-compile",
    help="hf static: static KV cache, batches padded to --max-batch-size, decode compiled once (CUDA graphs)")]
TP = Annotated[Optional[int], setting("tensor_parallel_size", help="vllm: tensor-parallel GPUs")]
PP = Annotated[Optional[int], setting("pipeline_parallel_size", help="vllm: pipeline-parallel stages")]
Keys = Annotated[Optional[str], setting("keys", help="CurveZMQ key folder (needed to bind a non-loopback address)")]
SaveResult = Annotated[Optional[str], Opt(
    "--save-result", help="also write the run's figures to this JSON file under vllm bench serve's result keys "
                          "and units (docs/load-and-results.md)")]
