"""The `hf` backend: any causal LM through transformers, static batches run by `model.generate()`.

Decoding is greedy `model.generate(do_sample=False, max_new_tokens=O_max, min_new_tokens=O_max)`, so EOS
never ends a batch early and every strategy does the same work; a row whose target is shorter keeps
riding along as padding (that is what a static batch costs) but its tokens past `output_len` are not
reported. Per-step timestamps come from a streamer: generate() hands it each step's new tokens
[B] already copied to the host (a CUDA sync), and it syncs once more before reading the clock (StepStreamer).
--torch-compile hands generate() a static cache over fixed shapes (compile_kwargs).

BOS: the traffic process tokenizes prompts without special tokens; the worker puts back in front
exactly what the model's tokenizer itself would (its BOS for Llama/Mistral, nothing for GPT-2), so the
model sees prompts as it was trained to. The model therefore reads prompt_len + 1 tokens per row; the
memory estimate uses prompt_len as the scheduler does (one token per row is noise).
"""
import gc
from collections.abc import Callable
from dataclasses import dataclass, fields

from batchlab.models.archs import RANDOM_SEED, build_random_model, facts, kv_token_bytes, random_arch
from batchlab.models.folders import resolve_model
from batchlab.protocol.clock import now
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.setting_groups import HFBackendSettings, SchedulerSettings, WorkerSettings, default_of
from batchlab.worker.backend import (Backend, BackendError, BackendInfo, BackendRequest, OutOfMemory, StepOutput,
                                    lockstep_output)
from batchlab.worker.hf.head import FORMS, MAX_TIMED_ROWS, HeadPlan, head_times, plan_table
from batchlab.worker.memory import (batch_kv_bytes, cpu_budget_bytes, cpu_peak_rss_bytes, reset_cpu_peak_rss,
                                    cuda_free_bytes, cuda_reserve_bytes, kv_shape)

WARMUP_TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. " * 2
WARMUP_OUTPUT_LENS = (4, 2)  # a 2-row batch of different lengths: padding and masks get exercised
COMPILE_COLUMN_BLOCK = 512  # --torch-compile: the static cache's columns, in blocks (a new block recompiles)


@dataclass(slots=True)
class HFSettings:
    """What the hf backend needs from a run's config."""

    model: str = default_of(WorkerSettings, "model")
    dtype: str = default_of(WorkerSettings, "dtype")
    device: str = default_of(WorkerSettings, "device")
    max_batch_size: int = default_of(SchedulerSettings, "max_batch_size")  # the worker's row cap
    memory_budget_bytes: int = 0  # 0: measured (CUDA) or a share of available RAM (CPU)
    strict_memory: bool = default_of(WorkerSettings, "strict_memory")
    # static batches: one fixed-shape decode step, compiled (see compile_kwargs)
    torch_compile: bool = default_of(HFBackendSettings, "torch_compile")
    pad_head: bool = True  # the LM head computes the row count and form it runs fastest at (worker.hf.head)


def resolve_device(name: str):
    """auto → cuda when present, else cpu; a bare "cuda" becomes the current CUDA device."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device, checkpoint_dtype):
    """auto → float32 on CPU; on CUDA the checkpoint's 16-bit dtype, else bfloat16 (float16 if unsupported)."""
    import torch

    if name != "auto":
        try:
            return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]
        except KeyError:
            raise BackendError(f"--dtype must be auto, float32, float16 or bfloat16, not {name!r}") from None
    if device.type != "cuda":
        return torch.float32
    if checkpoint_dtype in (torch.float16, torch.bfloat16):
        return checkpoint_dtype
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def settings_from_config(cfg, rows: int) -> HFSettings:
    """A RunConfig and the worker's row cap → HFSettings: the settings of the same name (the worker and hf
    groups'), the budget in bytes (static and continuous modes alike)."""
    shared = {f.name: getattr(cfg, f.name) for f in fields(HFSettings) if hasattr(cfg, f.name)}
    return HFSettings(**{**shared, "max_batch_size": rows})


def special_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer itself puts before a text (e.g. [BOS]); [] when it adds none."""
    plain = tokenizer.encode("a", add_special_tokens=False)
    full = tokenizer.encode("a", add_special_tokens=True)
    for k in range(len(full) - len(plain) + 1):
        if full[k:k + len(plain)] == plain:
            return full[:k]
    return []


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-pad to the longest prompt: (ids [B, S], attention mask [B, S])."""
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


class HFBackend(Backend):
    """Static batches through `model.generate()` on one device (see the module docstring)."""

    def __init__(self, settings: HFSettings) -> None:
        import torch

        self.torch, self.settings, self.model_facts = torch, settings, {}
        self.device = resolve_device(settings.device)
        started = now()
        self.tokenizer, self.model = self._load(settings.model)
        self.prefix = special_prefix(self.tokenizer)
        self.pad_id = self._pad_id()
        self.info = self._info(load_s=now() - started)
        self.info.facts.update(self.model_facts)  # e.g. "random weights, real architecture" (models.archs)
        self.head_plan: HeadPlan | None = None  # set by warmup() (worker.hf.head)

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "HFBackend":
        """Build from a RunConfig; continuous mode is worker.hf.continuous's job."""
        if mode != BatchingMode.STATIC:
            raise BackendError("HFBackend runs static batches only; continuous mode is "
                               "batchlab.worker.hf.continuous.HFContinuousBackend")
        return cls(settings_from_config(cfg, rows))

    # --- loading ----------------------------------------------------------------------------------
    def _load(self, name: str):
        """(tokenizer, model) on self.device; `NAME:random` is built from its config (models.archs)."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        try:
            arch = random_arch(name)
            path = resolve_model(name)
            config = AutoConfig.from_pretrained(path)
            dtype = resolve_dtype(self.settings.dtype, self.device, getattr(config, "dtype", None))
            tokenizer = AutoTokenizer.from_pretrained(path)
            if arch is not None:  # no weights on disk: seeded init straight on the device, in dtype
                self.model_facts = {**facts(arch), "random_seed": RANDOM_SEED,
                                    "init": "from_config on the device in the run's dtype"}
                return tokenizer, build_random_model(config, self.device, dtype)
            device_map = str(self.device) if self.device.type == "cuda" else None
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map)
        except (OSError, ValueError) as exc:
            raise BackendError(f"cannot load model {name!r}: {exc}") from exc
        return tokenizer, model.to(self.device).eval()

    def _pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, self.model.config.eos_token_id):
            if isinstance(candidate, list):
                candidate = candidate[0] if candidate else None
            if candidate is not None:
                return int(candidate)
        return 0

    def _info(self, load_s: float) -> BackendInfo:
        import transformers

        is_cuda = self.device.type == "cuda"
        layers, kv_heads, head_dim = kv_shape(self.model.config)
        per_token = kv_token_bytes(layers, kv_heads, head_dim, self.model.dtype.itemsize)
        facts = {"dtype": str(self.model.dtype).removeprefix("torch."), "layers": layers, "kv_heads": kv_heads,
                 "head_dim": head_dim, "n_params": sum(p.numel() for p in self.model.parameters()),
                 "torch": self.torch.__version__, "transformers": transformers.__version__,
                 "bos_prefix": self.prefix, "pad_id": self.pad_id, "load_s": round(load_s, 3),
                 "decode": "model.generate(do_sample=False, min_new_tokens=max_new_tokens)"
                 + (", static cache, batches padded to the row cap, torch.compile" if self.settings.torch_compile
                    else "")}
        device = f"{self.device} ({self.torch.cuda.get_device_name(self.device)})" if is_cuda else str(self.device)
        return BackendInfo(backend="hf", model=self.settings.model, mode=BatchingMode.STATIC,
                           max_batch_size=self.settings.max_batch_size, kv_bytes_per_token=per_token,
                           kv_budget_bytes=self._initial_budget(), device=device,
                           memory_kind="cuda_max_allocated" if is_cuda else "cpu_peak_rss", facts=facts)

    def _initial_budget(self) -> int:
        """--memory-budget, else on CPU a share of free RAM; on CUDA refined by warmup()."""
        if self.settings.memory_budget_bytes or self.device.type != "cuda":
            return cpu_budget_bytes(self.settings.memory_budget_bytes)
        return max(0, cuda_free_bytes(self.device) - cuda_reserve_bytes(0, 0, 0))

    # --- the Backend interface (static batches) ------------------------------------------------------
    def warmup(self) -> None:
        """A 2-row batch through the model; on CUDA it also measures the activation reserve."""
        started, is_cuda = now(), self.device.type == "cuda"
        before = self.torch.cuda.memory_allocated(self.device) if is_cuda else 0
        if is_cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
        rows = self.warmup_rows()
        self._generate(rows, lambda _out: None)
        if is_cuda:
            self._measure_cuda_budget(rows, before)
        self._pad_head()
        self.info.facts["warmup_s"] = round(now() - started, 3)

    def _pad_head(self) -> None:
        """Time the LM head and run each row count as it was fastest (worker.hf.head, up to MAX_TIMED_ROWS rows);
        not with --torch-compile, whose batches are padded to the row cap."""
        head = self.model.get_output_embeddings()
        if (not self.settings.pad_head or self.settings.torch_compile or self.head_plan is not None
                or not isinstance(head, self.torch.nn.Linear)):
            return
        rows = min(self.settings.max_batch_size, MAX_TIMED_ROWS)
        times = {form: head_times(head, rows, head.in_features, self.device, self.model.dtype, self.sync, now, form)
                 for form in FORMS}
        table = plan_table(times)
        self.head_plan = HeadPlan(head, table)
        self.info.facts["lm_head_plan"] = {str(m): f"{form} × {k}" for m, (form, k) in enumerate(table)
                                           if (form, k) != ("linear", m)}  # only the counts that changed
        self.info.facts["lm_head_ms"] = {form: [round(t * 1e3, 2) for t in ts] for form, ts in times.items()}

    def warmup_rows(self) -> list[BackendRequest]:
        """The warm-up batch: WARMUP_TEXT at two lengths, outputs WARMUP_OUTPUT_LENS."""
        ids = self.tokenizer.encode(WARMUP_TEXT, add_special_tokens=False)
        return [BackendRequest.new(-1 - i, len(ids) // (i + 1), n, ids[: len(ids) // (i + 1)], -1)
                for i, n in enumerate(WARMUP_OUTPUT_LENS)]

    def _measure_cuda_budget(self, rows: list[BackendRequest], before_bytes: int) -> None:
        peak = self.torch.cuda.max_memory_allocated(self.device)
        kv = batch_kv_bytes(len(rows), max(r.prompt_len for r in rows) + len(self.prefix),
                            max(r.output_len for r in rows), self.info.kv_bytes_per_token)
        reserve = cuda_reserve_bytes(peak, before_bytes, kv)
        self.info.facts["cuda_reserve_bytes"] = reserve
        if not self.settings.memory_budget_bytes:
            self.info.kv_budget_bytes = max(0, cuda_free_bytes(self.device) - reserve)
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def run_batch(self, rows: list[BackendRequest], on_step: Callable[[StepOutput], None]) -> None:
        """Run one static batch to its longest target; OutOfMemory when it does not fit."""
        self._check_strict_memory(rows)
        try:
            self._generate(rows, on_step)
        except self.torch.OutOfMemoryError as exc:
            gc.collect()
            self.free()
            raise OutOfMemory(f"{len(rows)} rows did not fit: {str(exc).splitlines()[0]}") from None

    def _check_strict_memory(self, rows: list[BackendRequest]) -> None:
        """--strict-memory: refuse a multi-row batch whose KV estimate exceeds the budget.

        A single row always runs (a request that fits alone must never fail for OOM; if it truly
        does not fit the device, the real error surfaces instead).
        """
        if not self.settings.strict_memory or len(rows) < 2:
            return
        need = batch_kv_bytes(len(rows), max(r.prompt_len for r in rows), max(r.output_len for r in rows),
                              self.info.kv_bytes_per_token)
        if need > self.info.kv_budget_bytes:
            raise OutOfMemory(f"{len(rows)} rows need ~{need} B of KV > budget {self.info.kv_budget_bytes} B")

    def _generate(self, rows: list[BackendRequest], on_step: Callable[[StepOutput], None]) -> None:
        torch = self.torch
        contexts = [self.prefix + list(r.prompt_tokens) for r in rows]
        steps = max(r.output_len for r in rows)
        extra = {}
        if self.settings.torch_compile:  # fixed shapes: the last row repeated up to the row cap (not reported)
            contexts += [contexts[-1]] * (self.settings.max_batch_size - len(rows))
            extra = compile_kwargs(max(len(c) for c in contexts) + steps, self.device)
        ids, mask = left_pad(contexts, self.pad_id)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)  # [B, S]
        attention_mask = torch.tensor(mask, dtype=torch.long, device=self.device)  # [B, S]
        streamer = StepStreamer(rows, on_step, self.sync)
        with torch.inference_mode():
            self.model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                                max_new_tokens=steps, min_new_tokens=steps, pad_token_id=self.pad_id,
                                streamer=streamer, **extra)

    def free(self) -> None:
        """Give the allocator's cached device memory back (CUDA; nothing on CPU)."""
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def sync(self) -> None:
        """Wait until the device has run what was queued (CUDA; nothing on CPU)."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def peak_memory_bytes(self) -> int:
        """CUDA: max allocated since warm-up ended; CPU: the worker process's peak RSS."""
        if self.device.type == "cuda":
            return int(self.torch.cuda.max_memory_allocated(self.device))
        return cpu_peak_rss_bytes()

    def reset(self) -> None:
        """Between runs of a warm worker: a fresh peak-memory reading (generate() keeps no state)."""
        if self.device.type == "cuda":
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_cpu_peak_rss()

    def close(self) -> None:
        """Drop the model and give cached device memory back."""
        self.model = None
        gc.collect()
        self.free()


class StepStreamer:
    """A generate() streamer that turns each decode step's tokens into one StepOutput."""

    def __init__(self, rows: list[BackendRequest], on_step: Callable[[StepOutput], None],
                 sync: Callable[[], None]) -> None:
        self.rows, self.on_step, self.sync = rows, on_step, sync
        self.step = -1  # -1: the next put() carries the prompt ids [B, S]
        self.last_time = now()

    def put(self, value) -> None:
        """value: prompt ids [B, S] on the first call, then the step's new tokens [B] (on the host)."""
        if self.step < 0:
            self.step, self.last_time = 0, now()
            return
        self.sync()
        t, tokens = now(), value.reshape(-1).tolist()
        self.on_step(lockstep_output(self.rows, self.step, lambda i, _r: tokens[i], t, self.last_time))
        self.step, self.last_time = self.step + 1, t

    def end(self) -> None:
        """Nothing buffered."""


def compile_kwargs(columns: int, device) -> dict:
    """--torch-compile: generate() with a static KV cache of COMPILE_COLUMN_BLOCK-rounded columns (it only
    grows, so a longer batch recompiles at most once per block) over batches padded to the row cap, so every
    decode step has one shape; transformers compiles that step (mode reduce-overhead, i.e. CUDA graphs, on
    CUDA; inductor's default on CPU, where it is for checking the path: it does not pay there)."""
    from transformers import CompileConfig

    cuda = device.type == "cuda"
    config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if cuda else "default")
    config._compile_all_devices = not cuda  # transformers compiles on CUDA by itself; on CPU only when asked
    block = COMPILE_COLUMN_BLOCK
    return {"cache_implementation": "static", "compile_config": config,
            "max_cache_len": -(-columns // block) * block}
