"""The `batchlab` command. Each command is a thin wrapper; heavy imports happen inside commands."""
import importlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.config import ConfigError, RunConfig, build_config, load_yaml
from cli.model_cmd import model_app

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Study how LLM requests should be batched.")
app.add_typer(model_app, name="model")
for _module in ("sweep_cmd", "report_cmd", "simulate_cmd"):  # TODO(lead): explicit imports once all exist
    if (Path(__file__).parent / f"{_module}.py").exists():
        importlib.import_module(f"cli.{_module}").register(app)

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


def _config(config: str | None, overrides: dict) -> RunConfig:
    """Defaults ← YAML ← options; a bad setting is one line and exit 1."""
    try:
        return build_config(load_yaml(config) if config else {}, overrides)
    except ConfigError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(code=1) from None


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise typer.Exit(code=1)


@app.command()
def run(*, config: ConfigOpt = None, strategy: Strategy = None, backend: Backend = None, model: Model = None,
        preset: Preset = None, rate: Rate = None, duration_s: Duration = None, arrival: Arrival = None,
        burstiness: Burst = None, dataset: Dataset = None, schedule: Schedule = None,
        batch_size: BatchSize = None, max_batch_size: MaxBatch = None, max_wait_ms: MaxWait = None,
        max_new_tokens: MaxNew = None, max_prompt_len: MaxPrompt = None, seed: Seed = None, out: Out = None,
        workers: Workers = None,
        max_queue: MaxQueue = None, max_queue_tokens: MaxQueueTok = None, memory_budget: Budget = None, strict_memory: Strict = None,
        dtype: Dtype = None, device: Device = None, endpoint: Endpoint = None,
        max_concurrency: MaxConc = None, gpu_memory_utilization: GpuUtil = None, max_num_seqs: MaxSeqs = None,
        max_num_batched_tokens: MaxTok = None, enforce_eager: Eager = None, tensor_parallel_size: TP = None,
        pipeline_parallel_size: PP = None) -> None:
    """Run traffic → scheduler → worker(s) → collector as processes, one command."""
    overrides = dict(locals())
    cfg = _config(overrides.pop("config"), overrides)
    from cli.live import run_with_status
    from traffic.datasets import DatasetError

    try:
        summary = run_with_status(cfg)
    except KeyboardInterrupt:
        _fail(f"interrupted; partial results in {cfg.out}")
    except (RuntimeError, DatasetError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(f"results in {cfg.out}: {summary['finished']} finished, {summary['failed']} failed")


@app.command()
def collector(*, address: Annotated[str, Opt(help="bind address (PULL)")] = "tcp://127.0.0.1:5558",
              out: Annotated[str, Opt(help="output folder")] = "runs/latest", keys: Keys = None) -> None:
    """Run the collector alone."""
    from cli.roles import collector_role

    _role(collector_role, RunConfig(out=out, keys=keys or ""), address)


def _role(role, *args) -> None:
    """Run one role in this process; its known failures become one line and exit 1."""
    from protocol.security import InsecureAddress
    from traffic.datasets import DatasetError
    from traffic.process import TrafficStartTimeout
    from worker.backend import BackendError

    try:
        code = role(*args)
    except (InsecureAddress, BackendError, DatasetError, ConfigError, TrafficStartTimeout, ValueError) as exc:
        _fail(str(exc))
    raise typer.Exit(code or 0)


keys_app = typer.Typer(no_args_is_help=True, help="CurveZMQ keys for non-loopback addresses.")
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
def keys_generate(folder: Annotated[str, typer.Argument(help="where to write the key folder")]) -> None:
    """Create server and client key pairs (copy the folder to every host of the run)."""
    from protocol.security import generate_keys

    typer.echo(f"keys written to {generate_keys(folder)}")


@app.command()
def scheduler(*, config: ConfigOpt = None, strategy: Strategy = None, batch_size: BatchSize = None,
              max_batch_size: MaxBatch = None, max_wait_ms: MaxWait = None, max_new_tokens: MaxNew = None,
              workers: Workers = None, max_queue: MaxQueue = None, max_queue_tokens: MaxQueueTok = None,
              out: Out = None, keys: Keys = None,
              address: Annotated[str, Opt(help="bind address (ROUTER)")] = "tcp://127.0.0.1:5557",
              collector: Annotated[str, Opt(help="collector address")] = "tcp://127.0.0.1:5558") -> None:
    """Run the scheduler alone (a new strategy in place of the old)."""
    overrides = {k: v for k, v in locals().items() if k not in ("config", "address", "collector")}
    from cli.roles import scheduler_role

    _role(scheduler_role, _config(config, overrides), address, collector)


@app.command()
def worker(*, config: ConfigOpt = None, backend: Backend = None, model: Model = None, preset: Preset = None,
           strategy: Strategy = None, max_batch_size: MaxBatch = None, memory_budget: Budget = None,
           strict_memory: Strict = None, dtype: Dtype = None, device: Device = None,
           endpoint: Endpoint = None, max_concurrency: MaxConc = None, out: Out = None, keys: Keys = None,
           gpu_memory_utilization: GpuUtil = None, max_num_seqs: MaxSeqs = None,
           max_num_batched_tokens: MaxTok = None, enforce_eager: Eager = None, tensor_parallel_size: TP = None,
           pipeline_parallel_size: PP = None,
           scheduler: Annotated[str, Opt(help="scheduler address")] = "tcp://127.0.0.1:5557",
           collector: Annotated[str, Opt(help="collector address")] = "tcp://127.0.0.1:5558",
           worker_id: Annotated[str, Opt(help="this worker's name")] = "worker-0") -> None:
    """Run one worker alone (e.g. on a remote GPU box)."""
    overrides = {k: v for k, v in locals().items()
                 if k not in ("config", "scheduler", "collector", "worker_id")}
    from cli.roles import worker_role

    _role(worker_role, _config(config, overrides), scheduler, collector, worker_id)


@app.command()
def traffic(*, config: ConfigOpt = None, model: Model = None, rate: Rate = None, duration_s: Duration = None,
            arrival: Arrival = None, burstiness: Burst = None, dataset: Dataset = None,
            schedule: Schedule = None, max_new_tokens: MaxNew = None, max_prompt_len: MaxPrompt = None,
            seed: Seed = None, out: Out = None, keys: Keys = None, scheduler: Annotated[str, Opt(help="scheduler address")] = "tcp://127.0.0.1:5557") -> None:
    """Run the traffic generator alone."""
    overrides = {k: v for k, v in locals().items() if k not in ("config", "scheduler")}
    from cli.roles import traffic_role

    _role(traffic_role, _config(config, overrides), scheduler)


if __name__ == "__main__":
    app()
