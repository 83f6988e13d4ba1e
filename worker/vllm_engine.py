"""The `vllm` backend: a vLLM v1 `LLMEngine` owned by the worker and stepped by it.

vLLM does its own iteration-level batching and paging. The engine core runs inside the worker's own
process (vLLM's in-process mode, VLLM_ENABLE_V1_MULTIPROCESSING=0): every `step()` is one engine
iteration (schedule, forward, sample), its tokens are stamped when it returns, and the engine starts no
process of its own that could outlive the worker.

What vLLM reports about itself is read here too: KV pool usage from its scheduler stats (KVUsage, stats_tap),
the pool's geometry (kv_geometry), and each request's own engine timestamps (engine_metrics).
"""
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from batchlab.models import folders
from batchlab.models.archs import facts, kv_token_bytes, random_arch
from batchlab.protocol.clock import now
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.setting_groups import SchedulerSettings, VLLMBackendSettings, WorkerSettings, default_of
from batchlab.protocol.status import FailureKind, detailed
from batchlab.worker.backend import Backend, BackendError, BackendInfo, BackendRequest, StepOutput

log = logging.getLogger("batchlab.vllm")

DEFAULT_CPU_KV_BYTES = 4 * 2**30  # KV pool on CPU when no --memory-budget is given
WARMUP_PROMPT_LEN = 8
WARMUP_OUTPUT_LEN = 4


@dataclass(slots=True)
class VLLMSettings:
    """Engine options taken from the run config."""

    model: str
    dtype: str = default_of(WorkerSettings, "dtype")
    max_num_seqs: int = default_of(SchedulerSettings, "max_batch_size")  # the group's 0 means this: the row cap
    max_num_batched_tokens: int = default_of(WorkerSettings, "max_num_batched_tokens")  # 0: vLLM's default
    gpu_memory_utilization: float = default_of(VLLMBackendSettings, "gpu_memory_utilization")
    enforce_eager: bool = default_of(VLLMBackendSettings, "enforce_eager")
    tensor_parallel_size: int = default_of(VLLMBackendSettings, "tensor_parallel_size")
    pipeline_parallel_size: int = default_of(VLLMBackendSettings, "pipeline_parallel_size")
    kv_cache_bytes: int = 0  # 0: vLLM decides (gpu_memory_utilization), DEFAULT_CPU_KV_BYTES on CPU
    warmup_requests: int = default_of(VLLMBackendSettings, "warmup_requests")


@dataclass(slots=True)
class VLLMRequest:
    """A request inside the vLLM engine: the row it runs, and the tokens it returned so far."""

    row: BackendRequest
    generated: int = 0


def settings_from_config(cfg, mode: str, rows: int) -> VLLMSettings:
    """RunConfig → VLLMSettings: the settings of the same name (the worker and vllm groups'), the budget in
    bytes, max_num_seqs 0 meaning the worker's row cap, `rows`."""
    shared = {f.name: getattr(cfg, f.name) for f in fields(VLLMSettings) if hasattr(cfg, f.name)}
    return VLLMSettings(**{**shared, "max_num_seqs": cfg.max_num_seqs or rows,
                           "kv_cache_bytes": cfg.memory_budget_bytes})


def _engine_args(s: VLLMSettings, on_cpu: bool):
    from vllm import EngineArgs

    try:  # tiny-mistral, `NAME:random` (config + tokenizer, no weights) → their folders (models.folders)
        model = folders.resolve_model(s.model)
    except ValueError as exc:  # an unknown NAME:random
        raise BackendError(str(exc)) from None
    kv_bytes = s.kv_cache_bytes or (DEFAULT_CPU_KV_BYTES if on_cpu else 0)
    # auto on CPU: float32 like the hf backend (vLLM's own auto would pick bfloat16), so both do the same work
    dtype = "float32" if on_cpu and s.dtype == "auto" else s.dtype
    return EngineArgs(
        # `NAME:random` → vLLM's dummy loader (random weights, no checkpoint); an unknown NAME is refused above
        model=model, dtype=dtype,
        load_format="dummy" if random_arch(s.model) is not None else "auto",
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens or None,
        gpu_memory_utilization=s.gpu_memory_utilization, enforce_eager=s.enforce_eager,
        tensor_parallel_size=s.tensor_parallel_size, pipeline_parallel_size=s.pipeline_parallel_size,
        kv_cache_memory_bytes=kv_bytes or None, disable_log_stats=False, seed=0)


def _model_facts(name: str) -> dict:
    """A `NAME:random` model's facts (models.archs.facts) plus how vLLM got its weights; {} otherwise."""
    arch = random_arch(name)
    return {**facts(arch), "load_format": "dummy (vLLM's random init)"} if arch is not None else {}


class VLLMBackend(Backend):
    """A vLLM engine in the worker process: admit() adds requests, step() runs one engine step."""

    fuse = True  # vLLM v1 runs a step's decodes and prefill tokens as one packed forward (step model: fused)

    def __init__(self, settings: VLLMSettings, mode: str = BatchingMode.CONTINUOUS) -> None:
        # In-process engine core: one step() = one iteration, and no EngineCore/Worker processes. With
        # the default multiprocessing the core loops on its own in another process, so step() only
        # collects what it produced meanwhile (tokens arriving together would share one time).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            from vllm.v1.engine.llm_engine import LLMEngine
            from vllm.platforms import current_platform
        except ImportError as exc:
            raise BackendError(f"--backend vllm needs the vllm package: {exc}") from None
        self.settings, self.usage = settings, KVUsage()
        self.on_cpu = current_platform.is_cpu()
        started = now()
        self.engine = LLMEngine.from_engine_args(_engine_args(settings, self.on_cpu),
                                                 stat_loggers=[stats_tap(self.usage)])
        self.live: dict[int, VLLMRequest] = {}
        self.failed: list[tuple[int, str]] = []
        self.request_metrics: dict[int, dict] = {}  # request_id -> vLLM's own timestamps (engine_metrics)
        self.clock_offset_s = now() - time.monotonic()
        self.info = self._info(mode, engine_start_s=now() - started)

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "VLLMBackend":
        """Build from a runner.config.RunConfig."""
        return cls(settings_from_config(cfg, mode, rows), mode)

    def _info(self, mode: str, engine_start_s: float) -> BackendInfo:
        geo = kv_geometry(self.engine)
        facts = {**geo, "engine_start_s": round(engine_start_s, 3), "vllm_settings": asdict(self.settings),
                 "engine_core": "in-process (one step() = one engine iteration)",
                 "prefix_caching": bool(self.engine.vllm_config.cache_config.enable_prefix_caching),
                 "prefix_cache_reset_between_runs": True,
                 "kv_cache_usage_source": "SchedulerStats.kv_cache_usage via a StatLogger",
                 "request_metrics_source": "RequestOutput.metrics (RequestStateStats)",
                 **_model_facts(self.settings.model)}
        return BackendInfo(backend="vllm", model=self.settings.model, mode=mode,
                           max_batch_size=self.settings.max_num_seqs, kv_bytes_per_token=geo["kv_bytes_per_token"],
                           kv_budget_bytes=geo["kv_pool_bytes"], device="cpu" if self.on_cpu else "cuda",
                           memory_kind="vllm_kv_pool", facts=facts)

    def _params(self, output_len: int):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=output_len, min_tokens=output_len,
                              detokenize=False, output_kind=RequestOutputKind.DELTA)

    # --- the Backend interface (continuous; static batches by the default run_batch) ---------------
    def warmup(self) -> None:
        """A couple of short requests through the engine; their stats are forgotten."""
        rows = [BackendRequest.new(-1 - i, WARMUP_PROMPT_LEN, WARMUP_OUTPUT_LEN,
                                   list(range(100, 100 + WARMUP_PROMPT_LEN)), -1)
                for i in range(self.settings.warmup_requests)]
        self.run_batch(rows, lambda _out: None)
        self.usage.reset()
        self.request_metrics.clear()

    def admit(self, rows: list[BackendRequest]) -> None:
        """Hand each row to the engine now (token ids in, no re-tokenization)."""
        from vllm import TokensPrompt

        for row in rows:
            try:
                self.engine.add_request(str(row.request_id), TokensPrompt(prompt_token_ids=row.prompt_tokens),
                                        self._params(row.output_len))
                self.live[row.request_id] = VLLMRequest(row)
            except Exception as exc:  # e.g. prompt longer than max_model_len: fail the row, not the worker
                reason = detailed(FailureKind.VLLM_REJECTED, f"{type(exc).__name__}: {exc}")
                self.failed.append((row.request_id, reason))

    def has_work(self) -> bool:
        """True while a request runs in the engine or a rejection waits to be reported."""
        return bool(self.live or self.failed)

    def step(self) -> StepOutput | None:
        """One engine step; None when it produced no tokens and nothing failed."""
        start = now()
        outputs = self.engine.step() if self.live else []
        out = StepOutput(time=now(), request_ids=[], token_ids=[], start_time=start, failed=self.failed, times=[])
        self.failed = []
        for ro in outputs:
            self._take(ro, out)
        out.running = self.usage.num_running_reqs or len(set(out.request_ids))
        return out if out.request_ids or out.failed else None

    def _take(self, ro, out: StepOutput) -> None:
        rid = int(ro.request_id)
        lv = self.live.get(rid)
        if lv is None:
            return
        new = list(ro.outputs[0].token_ids) if ro.outputs else []
        if new and lv.generated == 0:  # its prompt was prefilled in this step (whole: these prompts are
            out.joined += 1             # far below vLLM's per-step token budget)
            out.prefill_tokens += len(lv.row.prompt_tokens)
            out.prefill_rows += 1
            out.prefill_width = max(out.prefill_width, len(lv.row.prompt_tokens))
            out.prefill_pairs += len(lv.row.prompt_tokens) ** 2
        out.times.extend(self._token_times(ro.metrics, lv.generated, len(new), out))
        lv.generated += len(new)
        out.request_ids.extend([rid] * len(new))
        out.token_ids.extend(new)
        if ro.finished:
            del self.live[rid]
            self.request_metrics[rid] = engine_metrics(ro, self.clock_offset_s)
            if lv.generated == lv.row.output_len:
                out.finished.append(rid)
            else:
                out.failed.append((rid, f"vllm returned {lv.generated} of {lv.row.output_len} tokens"))

    def _token_times(self, metrics, generated: int, n_new: int, out: StepOutput) -> list[float]:
        """When each new token existed: vLLM's own engine-core stamp of this iteration's output
        (RequestStateStats.last_token_ts, also first_token_ts for the first) where it keeps one, else
        the step's return. In-process both lie within the step; the engine's is the earlier, exact one."""
        t = out.time
        if metrics is not None and getattr(metrics, "last_token_ts", 0.0):
            stamp = metrics.last_token_ts + self.clock_offset_s
            if out.start_time <= stamp <= out.time:  # a stamp from this iteration, on our clock
                t = stamp
        return [t] * n_new

    def abort_all(self) -> None:
        """Abort every live request in the engine (after a failed step) and drop unreported rejections."""
        if self.live:
            self.engine.abort_request([str(r) for r in self.live])
            self.live.clear()
        self.failed = []

    def reset(self) -> None:
        """Between runs of a warm worker: abort what is left, empty the prefix cache (no run may hit
        another's cached prompts), forget the stats."""
        self.abort_all()
        while self.engine.has_unfinished_requests():
            self.engine.step()
        if not self.engine.reset_prefix_cache():
            raise BackendError("vLLM refused to reset its prefix cache between runs")
        self.usage.reset()
        self.request_metrics.clear()

    def take_metrics(self, request_ids: list[int]) -> dict[int, dict]:
        """vLLM's own stamps of these ended requests (engine_metrics), taken."""
        return {rid: m for rid in request_ids if (m := self.request_metrics.pop(rid, None))}

    def peak_memory_bytes(self) -> int:
        """Peak KV pool bytes in use (vLLM's kv_cache_usage × pool size); the pool itself is reserved."""
        return int(self.usage.kv_cache_usage_peak * self.info.kv_budget_bytes)

    def run_facts(self) -> dict:
        """KV usage over the run, for a report or WorkerBye."""
        return {**asdict(self.usage), "kv_pool_bytes": self.info.kv_budget_bytes,
                "kv_peak_used_bytes": self.peak_memory_bytes()}

    def close(self) -> None:
        """Abort what runs and shut the EngineCore and its workers down."""
        if getattr(self, "engine", None) is None:
            return
        try:
            self.abort_all()
            self.engine.engine_core.shutdown()  # in-process: frees the executor; nothing to join
        except Exception:  # shutting down must never raise into the worker's finally
            log.exception("vLLM shutdown failed")
        self.engine = None
        self.live.clear()


@dataclass(slots=True)
class KVUsage:
    """What the engine's scheduler stats said over the run (filled by `_StatsTap`)."""

    kv_cache_usage: float = 0.0  # fraction of the KV pool in use at the last step
    kv_cache_usage_peak: float = 0.0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_preemptions: int = 0

    def reset(self) -> None:
        """Forget the warm-up."""
        self.kv_cache_usage = self.kv_cache_usage_peak = 0.0
        self.num_preemptions = 0


def stats_tap(usage: KVUsage) -> Callable:
    """A per-engine StatLogger factory that copies scheduler stats into `usage`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _StatsTap(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                usage.kv_cache_usage = scheduler_stats.kv_cache_usage
                usage.kv_cache_usage_peak = max(usage.kv_cache_usage_peak, scheduler_stats.kv_cache_usage)
                usage.num_running_reqs = scheduler_stats.num_running_reqs
                usage.num_waiting_reqs = scheduler_stats.num_waiting_reqs
            if iteration_stats is not None:
                usage.num_preemptions += iteration_stats.num_preempted_reqs

        def log_engine_initialized(self) -> None:
            pass

    return _StatsTap


def kv_geometry(engine) -> dict:
    """Pool facts from the started engine: blocks, block size, bytes per token, pool bytes."""
    vc = engine.vllm_config
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    import torch

    dtype = mc.dtype if cc.cache_dtype == "auto" else getattr(torch, cc.cache_dtype, mc.dtype)
    layers = mc.get_num_layers(pc) * pc.pipeline_parallel_size
    per_token = kv_token_bytes(layers, mc.get_total_num_kv_heads(), mc.get_head_size(), dtype.itemsize)
    blocks, block_size = int(cc.num_gpu_blocks or 0), int(cc.block_size)
    return {"kv_pool_blocks": blocks, "kv_block_size_tokens": block_size, "kv_pool_tokens": blocks * block_size,
            "kv_bytes_per_token": per_token, "kv_pool_bytes": blocks * block_size * per_token,
            "kv_cache_memory_bytes_setting": cc.kv_cache_memory_bytes or 0,
            "dtype": str(mc.dtype).removeprefix("torch.")}


def engine_metrics(ro, offset_s: float) -> dict:
    """vLLM's own per-request timestamps (EngineCore monotonic clock → protocol.clock) and how many
    prompt tokens its prefix cache served."""
    cached = {"cached_tokens": int(ro.num_cached_tokens)} if getattr(ro, "num_cached_tokens", None) is not None else {}
    m = ro.metrics
    if m is None:
        return cached
    return {**cached, "queued_ts": m.queued_ts + offset_s, "scheduled_ts": m.scheduled_ts + offset_s,
            "first_token_ts": m.first_token_ts + offset_s, "last_token_ts": m.last_token_ts + offset_s,
            "first_token_latency_s": m.first_token_latency, "num_preemptions": m.num_preemptions}
