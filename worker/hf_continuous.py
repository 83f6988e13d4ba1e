"""The `hf` backend in continuous mode: iteration-level batching by a hand-written greedy decode loop.

Every `step()` is one step boundary: (1) one batched decode forward over the running rows gives each its
next token; (2) the rows admitted since the last step are prefilled together (left-padded) and each gets its
first token from its own prefill; (3) rows that reached `output_len` leave; (4) the joiners join the running
set (in the slot layout their KV is already in place). Each token is stamped (`StepOutput.times`) when it
reached the host: a running row's when the decode's argmax is read back (on CUDA that copy is the sync), a
joiner's after its prefill, so a joiner's prefill does not inflate the running rows' inter-token latency.
Decoding is greedy with EOS banned (logit −inf, as generate()'s min_new_tokens does), so every row gets
exactly `output_len` tokens and they match the static path even where EOS is the model's top choice.

KV layout (`worker.hf_layouts`): `slots`, the default (`worker.hf_slots.SlotKV`), keeps per layer one K and
one V tensor [slots, kv_heads, columns, head_dim], allocated once and grown only when an admitted row's final
length or the row count outgrows it; running row i lives in slot i and is written in place at its own column,
a joiner is prefilled straight into the next free slot, a finished row frees its slot (the last row moves
into the hole). Last tokens, positions and lengths stay on the device; a decode step reads back only its
tokens. Decode attention reads the grouped KV heads without repeating them (`slot_attention`, registered with
transformers' AttentionInterface; prefill and generate() keep transformers' SDPA). `padded`, the earlier
layout (`worker.hf_kv.PaddedKV`), keeps one left-padded `DynamicCache`: every step concatenates it, a joiner
re-pads it, a leaver copies it; kept for comparison (benchmarks/continuous_step.py) and as a fallback.
Padded columns are masked out in both, so a row's greedy tokens match a solo run up to float rounding
(tests/test_hf_continuous.py checks the token ids on tiny-mistral). Caches must be plain full-attention
layers (sliding-window or hybrid models are refused at warm-up).

Why not transformers' `ContinuousBatchingManager`: it generates on its own background thread, so step
boundaries (rows running, joined, finished per step) are not visible and the worker's step-by-step
loop would become a queue reader competing for the GIL on a 2-core CPU; its paged cache is sized by its
own heuristic (its first request took ~20 s to allocate on this CPU) rather than our KV budget.

Memory: a joiner waits (`run_facts()["row_steps_waiting"]`) while the cache it would need (running rows ×
the widest row's final length) could outgrow `kv_budget_bytes` (the slot layout rounds its allocation up to
whole blocks of columns and doubles its slots, so it may hold up to that much more); a row alone always
runs. On a real OOM the row cap halves (`RowCap`: back up by one after CLEAN_STEPS_TO_PROBE clean steps, as
the static back-off probes; the worker reports every change to the scheduler, whose credit follows, and rows
already over the cap wait here); joiners go back to the queue's front; a failed decode drops the
(half-updated) cache and requeues the running rows, which resume by recompute (a row's context keeps its
generated tokens); a row that cannot run alone fails with the reason. No row is dropped.
"""
from dataclasses import dataclass, replace

from batchlab.protocol.clock import now
from batchlab.worker.backend import BackendError, Row, StepOutput
from batchlab.worker.hf import HFBackend, HFSettings, settings_from_config
from batchlab.worker.hf_layouts import LAYOUTS, make_layout

CLEAN_STEPS_TO_PROBE = 640  # steps without an OOM before the row cap rises by one: the static back-off's
# 20 clean batches (scheduler.policies) × 32 steps, one batch's worth at the CPU config's 32-token outputs
DECODE = {"slots": "greedy loop, EOS banned: one batched decode forward per step, joiners prefilled together "
                   "into free slots of a preallocated per-row KV cache, grouped-query decode attention",
          "padded": "greedy loop, EOS banned: one batched decode forward per step, joiners prefilled together, "
                    "left-padded DynamicCache"}


def eos_ids(model, tokenizer) -> list[int]:
    """The ids generate() bans under min_new_tokens (generation config's EOS), else the tokenizer's EOS."""
    ids = model.generation_config.eos_token_id
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


@dataclass(slots=True)
class RowCap:
    """Rows run at once: halved by an OOM (min 1), +1 after CLEAN_STEPS_TO_PROBE clean steps, up to `limit`."""

    limit: int  # the cap announced at hello
    rows: int = 0
    reason: str = "announced"
    clean_steps: int = 0
    oom_in_step: bool = False

    def __post_init__(self) -> None:
        self.rows = self.rows or self.limit

    def halve(self, rows_at_oom: int) -> None:
        """An OOM with `rows_at_oom` rows in the forward (rows over the cap never raise it)."""
        self.rows = max(1, min(self.rows, rows_at_oom) // 2)
        self.reason = f"out of memory with {rows_at_oom} rows"
        self.clean_steps, self.oom_in_step = 0, True

    def end_step(self) -> None:
        """Count a finished step; enough in a row without an OOM probe the cap up by one."""
        if self.oom_in_step:
            self.oom_in_step = False
            return
        self.clean_steps += 1
        if self.clean_steps >= CLEAN_STEPS_TO_PROBE and self.rows < self.limit:
            self.rows, self.clean_steps = self.rows + 1, 0
            self.reason = f"probe: {CLEAN_STEPS_TO_PROBE} steps without an out-of-memory"


@dataclass(slots=True)
class _Live:
    """A row in flight: `context` (prefix + prompt + tokens so far) is what a (re)prefill reads."""

    row: Row
    context: list[int]
    generated: int = 0

    def remaining(self) -> int:
        return self.row.output_len - self.generated


class HFContinuousBackend:
    """Continuous batching over an HF causal LM (see the module docstring); loading is HFBackend's."""

    def __init__(self, settings: HFSettings, layout: str = "slots") -> None:
        if layout not in LAYOUTS:
            raise BackendError(f"unknown KV layout {layout!r} (one of {', '.join(LAYOUTS)})")
        self.base = HFBackend(settings)  # model, tokenizer, BOS prefix, pad id, budget, device
        self.torch, self.model, self.device = self.base.torch, self.base.model, self.base.device
        self.decode_fact = DECODE[layout]
        self.info = replace(self.base.info, mode="continuous",
                            facts={**self.base.info.facts, "decode": self.decode_fact})
        self.kv = make_layout(layout, self.torch, self.model, self.device, self.info.max_batch_size)
        self.eos = self.torch.tensor(eos_ids(self.model, self.base.tokenizer), dtype=self.torch.long,
                                     device=self.device)  # [E]
        self.pending: list[_Live] = []
        self.refused: list[tuple[int, str]] = []  # rows admit() could not take, failed at the next step
        self.window = 0  # a sliding-window model's window (tokens); 0: full attention
        self.running: list[_Live] = []
        self.cap = RowCap(self.info.max_batch_size)  # what the worker reports to the scheduler
        self.stats = {"row_steps_waiting": 0, "preempted_rows": 0, "oom_requeues": 0}

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "HFContinuousBackend":
        """Build from a RunConfig (continuous mode only), with `rows` slots."""
        if mode != "continuous":
            raise BackendError("HFContinuousBackend runs continuous mode only")
        return cls(settings_from_config(cfg, rows))

    # --- the ContinuousBackend protocol -------------------------------------------------------------
    def warmup(self) -> None:
        """HFBackend's warm-up (and CUDA reserve measurement), then the warm-up rows through this loop."""
        self.base.warmup()
        self.info.kv_budget_bytes = self.base.info.kv_budget_bytes  # CUDA: measured by the warm-up
        self.info.facts.update(self.base.info.facts, decode=self.decode_fact)
        self._check_cache_layers()
        started = now()
        self.admit(self.base.warmup_rows())
        while self.has_work():
            self.step()
        self.stats = dict.fromkeys(self.stats, 0)
        self.info.facts["continuous_warmup_s"] = round(now() - started, 3)

    def admit(self, rows: list[Row]) -> None:
        """Rows join at the next step boundary; a row longer than a sliding-window model's window is
        refused (reported failed at the next step): the loop attends over every key it keeps."""
        for r in rows:
            lv = _Live(r, self.base.prefix + list(r.prompt_tokens))
            if self.window and len(lv.context) + r.output_len > self.window:
                self.refused.append((r.request_id, f"longer than the model's sliding window ({self.window} tokens): "
                                                   "continuous hf attends over the whole context"))
            else:
                self.pending.append(lv)

    def has_work(self) -> bool:
        """True while any admitted row waits or runs, or a refusal waits to be reported."""
        return bool(self.pending or self.running or self.refused)

    @property
    def max_rows(self) -> int:
        """The rows a step runs at most now (the worker reports changes as WorkerCapacity)."""
        return self.cap.rows

    @max_rows.setter
    def max_rows(self, rows: int) -> None:
        self.cap.rows = rows

    @property
    def max_rows_reason(self) -> str:
        """Why the cap last moved."""
        return self.cap.reason

    def abort_all(self) -> None:
        """Drop every admitted row and the cache (after a failed step: else the next step repeats it)."""
        self.pending, self.running, self.refused = [], [], []
        self.kv.clear()
        self._free()

    def step(self) -> StepOutput | None:
        """Decode the running rows, prefill the joiners, retire finished rows, merge the joiners."""
        if not self.has_work():
            return None
        out = StepOutput(time=0.0, request_ids=[], token_ids=[], start_time=now(), times=[], failed=self.refused)
        self.refused = []
        with self.torch.inference_mode():
            self._decode(out)
            joiners = self._prefill(self._take_joiners(), out)
            out.running, out.joined = len(out.request_ids), len(joiners)
            self._retire(joiners)
        self.cap.end_step()
        self._sync()
        out.time = now()  # the step's end (cache merged); each token's own time is in out.times
        return out

    def peak_memory_bytes(self) -> int:
        """As HFBackend: CUDA max allocated, or the process's peak RSS on CPU."""
        return self.base.peak_memory_bytes()

    def run_facts(self) -> dict:
        """Waits, preemptions and OOM requeues over the run (WorkerBye stats)."""
        return dict(self.stats)

    def reset(self) -> None:
        """Between runs of a warm worker: no rows, an empty cache, the full row cap, fresh stats and peak."""
        self.abort_all()
        self.cap = RowCap(self.info.max_batch_size)
        self.stats = dict.fromkeys(self.stats, 0)
        self.base.reset()

    def close(self) -> None:
        """Drop the cache and the model."""
        self.kv.clear()
        self.model = None
        self.base.close()

    # --- one step -----------------------------------------------------------------------------------
    def _decode(self, out: StepOutput) -> None:
        """One batched forward over the running rows: each gets its next token."""
        if not self.running:
            return
        try:
            logits = self.kv.decode(self.model, self.running)  # [R, 1, V]
        except self.torch.OutOfMemoryError:
            self._preempt_all(out)
            return
        tokens, host = self._pick(logits)
        self.kv.decoded(tokens)
        self._emit(self.running, host, now(), out)

    def _take_joiners(self) -> list[_Live]:
        """Pending rows, oldest first, while the cache would stay within the KV budget."""
        slots = self.cap.rows - len(self.running)  # < 0 after an OOM: the rows over the cap run on
        n = 0
        while n < min(slots, len(self.pending)) and self._fits(self.pending[: n + 1]):
            n += 1
        if n == 0 and not self.running and self.pending:
            n = 1  # a row alone always runs
        self.stats["row_steps_waiting"] += len(self.pending) - n
        joiners, self.pending = self.pending[:n], self.pending[n:]
        return joiners

    def _fits(self, joiners: list[_Live]) -> bool:
        """Upper bound of the padded cache at its widest: rows × (width now + longest remaining)."""
        lives = self.running + joiners
        width = max([self.kv.width()] + [len(lv.context) for lv in joiners])
        need = len(lives) * (width + max(lv.remaining() for lv in lives)) * self.info.kv_bytes_per_token
        return need <= self.info.kv_budget_bytes

    def _prefill(self, joiners: list[_Live], out: StepOutput) -> list[_Live]:
        """Left-padded prefill of the joiners together: their first tokens, their KV in the layout."""
        if not joiners:
            return []
        try:
            logits = self.kv.prefill(self.model, joiners, self.running, self.base.pad_id)  # [J, 1, V]
        except self.torch.OutOfMemoryError:
            return self._requeue_or_fail(joiners, out)
        tokens, host = self._pick(logits)
        self.kv.prefilled(tokens)
        self._emit(joiners, host, now(), out)
        return joiners

    def _pick(self, logits):
        """Greedy next tokens from logits [N, 1, V], EOS banned since output lengths are exact: (on the
        device [N], on the host)."""
        scores = logits[:, -1]  # [N, V]
        if self.eos.numel():
            scores = scores.index_fill(-1, self.eos, float("-inf"))
        tokens = scores.argmax(-1)  # [N]
        return tokens, tokens.tolist()  # the host read (a CUDA sync): the tokens exist from here

    def _emit(self, lives: list[_Live], tokens: list[int], t: float, out: StepOutput) -> None:
        """Append each row's token, stamped `t` (when it reached the host), and note rows now done."""
        for lv, token in zip(lives, tokens):
            lv.context.append(token)
            lv.generated += 1
            out.request_ids.append(lv.row.request_id)
            out.token_ids.append(token)
            out.times.append(t)
            if lv.remaining() <= 0:
                out.finished.append(lv.row.request_id)

    def _retire(self, joiners: list[_Live]) -> None:
        """Finished rows leave the running set and the cache; unfinished joiners join it."""
        lives = self.running + joiners
        done = [i for i, lv in enumerate(lives) if lv.remaining() <= 0]
        if done or joiners:
            self.running = [lives[i] for i in self.kv.retire(done)]

    # --- out of memory ------------------------------------------------------------------------------
    def _requeue_or_fail(self, joiners: list[_Live], out: StepOutput) -> list[_Live]:
        """A prefill OOM: a row alone fails with the reason; else the joiners wait at the queue's front."""
        self._free()
        if len(joiners) == 1 and not self.running:
            out.failed.append((joiners[0].row.request_id, "out of memory: the prompt does not fit alone"))
            return []
        self.cap.halve(len(self.running) + len(joiners))
        self.stats["oom_requeues"] += len(joiners)
        self.pending = joiners + self.pending
        return []

    def _preempt_all(self, out: StepOutput) -> None:
        """A decode OOM leaves the cache half-updated: drop it; the rows resume by recompute, fewer at a time."""
        self.kv.clear()
        self._free()
        if len(self.running) == 1:
            out.failed.append((self.running[0].row.request_id, "out of memory: the row does not fit alone"))
        else:
            self.cap.halve(len(self.running))
            self.stats["preempted_rows"] += len(self.running)
            self.pending = self.running + self.pending
        self.running = []

    def _free(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()

    def _check_cache_layers(self) -> None:
        """Every layer must be full attention, or a sliding window (Mistral-7B's 4096): inside the window a
        sliding-window model is the same model, and rows that would outgrow it are refused at admit()."""
        from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

        with self.torch.inference_mode():
            layers = self.model(input_ids=self.torch.tensor([[self.base.pad_id]], device=self.device),
                                use_cache=True).past_key_values.layers
        if any(type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
            raise BackendError("continuous hf needs full-attention or sliding-window caches, got "
                               f"{sorted({type(layer).__name__ for layer in layers})}")
        # the loop attends over every key it keeps: a row must fit the window (Mistral-7B's 4096) to be
        # the same model; whether transformers built sliding-window layers depends on its config's layer_types
        self.window = int(getattr(self.model.config.get_text_config(), "sliding_window", None) or 0)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

