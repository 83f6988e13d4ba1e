"""The `hf` backend in continuous mode: iteration-level batching by a hand-written greedy decode loop.
docs/workers.md ("Continuous batching on the Hugging Face worker") says why not transformers'
`ContinuousBatchingManager` and gives the slot cache's and chunked prefill's measured stalls.

Every `step()` is one step boundary: (1) rows admitted since the last step start prefilling; (2) the prompt
chunks that fit what the running rows' decodes leave of the step's token budget are planned
(worker.hf.chunks); (3) one fused forward runs the decodes and the chunks together (the slot layout; else a
decode forward, then a prefill forward): each running row gets its next token, and a row whose last chunk
ran gets its first; (4) finished rows leave, fully prefilled ones join the running set. A token is stamped
(`StepOutput.times`) when it reached the host, i.e. when the argmax of the forward that made it is read back
(on CUDA that copy is the sync); the budget bounds how long a chunk delays the running rows' next tokens.
Tokens are greedy with EOS banned (`pick`, below), so every row gets exactly `output_len` tokens and they
match the static path even where EOS is the model's top choice.

KV layout (`worker.hf.layouts`): `slots`, the default (`worker.hf.slots.SlotKV`), or `padded`
(`worker.hf.layouts.PaddedKV`: the earlier left-padded `DynamicCache`, whole prompts only, kept for comparison).
Both mask what is not a row's own, so its greedy tokens match a solo run (tests/test_hf_continuous.py).
A sliding-window model runs rows that fit its window and refuses longer ones.

Memory: a joiner waits (`run_facts()["row_steps_waiting"]`) while the cache it would need (running rows ×
the widest row's final length) could outgrow `kv_budget_bytes` (the slot layout rounds its allocation up to
whole blocks of columns and doubles its slots, so it may hold up to that much more); a row alone always
runs. On a real OOM the row cap halves (`RowCap`: back up by one after CLEAN_STEPS_TO_PROBE clean steps, as
the static back-off probes; the worker reports every change to the scheduler, whose credit follows, and rows
already over the cap wait here); a failed prefill sends the prefilling rows back to the queue's front (their
chunks dropped); a failed decode drops the (half-updated) cache and requeues every row, which resumes by
recompute (a row's context keeps its generated tokens); a row that cannot run alone fails with the reason.
"""
from dataclasses import dataclass, replace

from batchlab.protocol.clock import now
from batchlab.protocol.modes import BatchingMode
from batchlab.protocol.status import FailureReason
from batchlab.worker.backend import Backend, BackendError, BackendRequest, StepOutput
from batchlab.worker.hf.chunks import HFContinuousRequest, chunk_shape, chunks_of, plan_chunks, step_budget
from batchlab.worker.hf.layouts import DESCRIPTIONS, LAYOUTS, sliding_window
from batchlab.worker.hf.static import HFBackend, HFSettings, settings_from_config

CLEAN_STEPS_TO_PROBE = 640  # steps without an OOM before the row cap rises by one: the static back-off's
# 20 clean batches (scheduler.policies) × 32 steps, one batch's worth at the CPU config's 32-token outputs


class HFContinuousBackend(Backend):
    """Continuous batching over an HF causal LM (see the module docstring); loading is HFBackend's."""

    def __init__(self, settings: HFSettings, layout: str = "slots", max_num_batched_tokens: int = 0,
                 fuse: bool = True) -> None:
        if layout not in LAYOUTS:
            raise BackendError(f"unknown KV layout {layout!r} (one of {', '.join(LAYOUTS)})")
        if settings.torch_compile:
            raise BackendError("--torch-compile applies to static hf batches: the continuous loop's forwards change "
                               "shape every step (rows, columns, chunks)")
        self.base = HFBackend(settings)  # model, tokenizer, BOS prefix, pad id, budget, device
        self.torch, self.model, self.device = self.base.torch, self.base.model, self.base.device
        # tokens per step, decodes and prefill chunks together (None: no limit; the padded layout has none)
        self.budget = (step_budget(max_num_batched_tokens, settings.max_batch_size, self.device.type)
                       if layout == "slots" else None)
        self.decode_fact = DESCRIPTIONS[layout]
        self.info = replace(self.base.info, mode=BatchingMode.CONTINUOUS,
                            facts={**self.base.info.facts, "decode": self.decode_fact, **self._budget_fact()})
        self.kv = LAYOUTS[layout](self.torch, self.model, self.device, self.info.max_batch_size)
        self.fuse = fuse and callable(self.kv.fused)  # decodes and chunks in one forward (the slot layout)
        self.eos = self.torch.tensor(eos_ids(self.model, self.base.tokenizer), dtype=self.torch.long,
                                     device=self.device)  # [E]
        self.pending: list[HFContinuousRequest] = []  # admitted, waiting for a slot
        self.prefilling: list[HFContinuousRequest] = []  # in a slot, prompt partly in the cache (oldest first)
        self.refused: list[tuple[int, str]] = []  # rows admit() could not take, failed at the next step
        self.window = 0  # a sliding-window model's window (tokens); 0: full attention
        self.running: list[HFContinuousRequest] = []
        self.cap = RowCap(self.info.max_batch_size, CLEAN_STEPS_TO_PROBE)  # what the worker reports to the scheduler
        self.stats = {"row_steps_waiting": 0, "preempted_rows": 0, "oom_requeues": 0}

    @classmethod
    def from_config(cls, cfg, mode: str, rows: int) -> "HFContinuousBackend":
        """Build from a RunConfig (continuous mode only), with `rows` slots."""
        if mode != BatchingMode.CONTINUOUS:
            raise BackendError("HFContinuousBackend runs continuous mode only")
        return cls(settings_from_config(cfg, rows), max_num_batched_tokens=cfg.max_num_batched_tokens)

    # --- the Backend interface (continuous) ----------------------------------------------------------
    def warmup(self) -> None:
        """HFBackend's warm-up (and CUDA reserve measurement), then the warm-up rows through this loop."""
        self.base.warmup()
        self.info.kv_budget_bytes = self.base.info.kv_budget_bytes  # CUDA: measured by the warm-up
        self.info.facts.update(self.base.info.facts, decode=self.decode_fact, **self._budget_fact())
        self.window = sliding_window(self.torch, self.model, self.device, self.base.pad_id)
        started = now()
        self.admit(self.base.warmup_rows())
        while self.has_work():
            self.step()
        self.stats = dict.fromkeys(self.stats, 0)
        self.info.facts["continuous_warmup_s"] = round(now() - started, 3)

    def admit(self, rows: list[BackendRequest]) -> None:
        """Rows join at the next step boundary; a row longer than a sliding-window model's window is
        refused (reported failed at the next step): the loop attends over every key it keeps."""
        for r in rows:
            lv = HFContinuousRequest(r, self.base.prefix + list(r.prompt_tokens))
            if self.window and len(lv.context) + r.output_len > self.window:
                self.refused.append((r.request_id, f"longer than the model's sliding window ({self.window} tokens): "
                                                   "continuous hf attends over the whole context"))
            else:
                self.pending.append(lv)

    def has_work(self) -> bool:
        """True while any admitted row waits or runs, or a refusal waits to be reported."""
        return bool(self.pending or self.prefilling or self.running or self.refused)

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
        self.pending, self.prefilling, self.running, self.refused = [], [], [], []
        self.kv.clear()
        self.base.free()

    def step(self) -> StepOutput | None:
        """Decode the running rows, prefill chunks within the budget, retire finished rows, merge the joiners."""
        if not self.has_work():
            return None
        out = StepOutput(time=0.0, request_ids=[], token_ids=[], start_time=now(), times=[], failed=self.refused)
        self.refused = []
        with self.torch.inference_mode():
            self._join()
            counts = self._plan()
            fused = bool(self.fuse and self.running and counts)
            if not fused:
                self._decode(out)
            joiners = self._prefill(out, counts, fused)
            out.running, out.joined = len(out.request_ids), len(joiners)
            self._retire(joiners)
        self.cap.end_step()
        self.base.sync()
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
        self.cap = RowCap(self.info.max_batch_size, CLEAN_STEPS_TO_PROBE)
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
        tokens, host = pick(self.eos, logits)
        self.kv.decoded(tokens)
        emit(self.running, host, now(), out)

    def _join(self) -> None:
        """Pending rows start prefilling (in the slot layout: in the next free slots), oldest first, while the
        cache would stay within the KV budget."""
        slots = self.cap.rows - len(self.running) - len(self.prefilling)  # < 0 after an OOM: those run on
        n = 0
        while n < min(slots, len(self.pending)) and self._fits(self.pending[: n + 1]):
            n += 1
        if n == 0 and not self.running and not self.prefilling and self.pending:
            n = 1  # a row alone always runs
        self.stats["row_steps_waiting"] += len(self.pending) - n
        joiners, self.pending = self.pending[:n], self.pending[n:]
        if joiners:
            self.kv.add(len(joiners))
            self.prefilling += joiners

    def _fits(self, joiners: list[HFContinuousRequest]) -> bool:
        """Upper bound of the padded cache at its widest: rows × (width now + longest remaining)."""
        lives = self.running + self.prefilling + joiners
        width = max([self.kv.widest()] + [len(lv.context) for lv in self.prefilling + joiners])
        need = len(lives) * (width + max(lv.remaining() for lv in lives)) * self.info.kv_bytes_per_token
        return need <= self.info.kv_budget_bytes

    def _plan(self) -> list[int]:
        """Prompt tokens each prefilling row runs this step: what the running rows' decodes leave of the budget."""
        left = None if self.budget is None else self.budget - len(self.running)
        return plan_chunks(left, [lv.unfilled() for lv in self.prefilling])

    def _prefill(self, out: StepOutput, counts: list[int], fused: bool) -> list[HFContinuousRequest]:
        """One forward over the planned chunks, and with `fused` over the running rows' decodes too (the slot
        layout's fused step): the rows whose last chunk ran get their first tokens (returned: they run from the
        next step), the running rows (fused) their next, all stamped when they reach the host."""
        if not counts:
            return []
        lives = self.prefilling[: len(counts)]
        rows = len(self.running) if fused else 0
        try:
            if fused:
                logits = self.kv.fused(self.model, chunks_of(lives, counts), self.running, self.prefilling)
            else:
                logits = self.kv.prefill(self.model, chunks_of(lives, counts), self.running, self.prefilling,
                                         self.base.pad_id)  # [J, 1, V]
        except self.torch.OutOfMemoryError:  # fused: the running rows' cache is whole (the forward wrote only
            self._requeue_or_fail(out)        # columns past theirs): they decode again, the prefilling rows wait
            return []
        done = filled(lives, counts, out)
        tokens, host = pick(self.eos, logits[: rows + len(done)]) if rows or done else (None, [])
        if rows:
            self.kv.decoded(tokens[:rows])
        self.kv.prefilled(tokens[rows:] if done else None, len(done))
        t = now()
        emit(self.running[:rows], host[:rows], t, out)
        emit(done, host[rows:], t, out)
        self.prefilling = self.prefilling[len(done):]
        return done

    def _retire(self, joiners: list[HFContinuousRequest]) -> None:
        """Finished rows leave the running set and the cache; unfinished joiners join it."""
        lives = self.running + joiners
        done = [i for i, lv in enumerate(lives) if lv.remaining() <= 0]
        if done or joiners:
            self.running = [lives[i] for i in self.kv.release(done)]

    # --- out of memory ------------------------------------------------------------------------------
    def _requeue_or_fail(self, out: StepOutput) -> None:
        """A prefill OOM: a row alone fails with the reason; else the prefilling rows wait at the queue's
        front (their chunks so far are dropped: they prefill again from the start)."""
        self.base.free()
        joiners = self._unprefill()
        if len(joiners) == 1 and not self.running:
            out.failed.append((joiners[0].row.request_id, FailureReason.OOM_PROMPT_ALONE))
            return
        self.cap.halve(len(self.running) + len(joiners))
        self.stats["oom_requeues"] += len(joiners)
        self.pending = joiners + self.pending

    def _unprefill(self) -> list[HFContinuousRequest]:
        """Take the prefilling rows out of their slots, nothing of them cached."""
        self.kv.drop_prefilling()
        lives, self.prefilling = self.prefilling, []
        for lv in lives:
            lv.filled = 0
        return lives

    def _preempt_all(self, out: StepOutput) -> None:
        """A decode OOM leaves the cache half-updated: drop it; the rows resume by recompute, fewer at a time."""
        back = self._unprefill()
        self.kv.clear()
        self.base.free()
        if len(self.running) == 1:
            out.failed.append((self.running[0].row.request_id, FailureReason.OOM_ROW_ALONE))
        else:
            self.cap.halve(len(self.running))
            self.stats["preempted_rows"] += len(self.running)
            back = self.running + back
        for lv in back:
            lv.filled = 0
        self.pending = back + self.pending
        self.running = []

    def _budget_fact(self) -> dict:
        return {"max_num_batched_tokens": self.budget or 0}  # 0: no limit (prompts prefilled whole)


@dataclass(slots=True)
class RowCap:
    """Rows run at once: halved by an OOM (min 1), +1 after `probe_steps` clean steps, up to `limit`."""

    limit: int  # the cap announced at hello
    probe_steps: int  # clean steps before the cap rises by one (CLEAN_STEPS_TO_PROBE)
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
        if self.clean_steps >= self.probe_steps and self.rows < self.limit:
            self.rows, self.clean_steps = self.rows + 1, 0
            self.reason = f"probe: {self.probe_steps} steps without an out-of-memory"


def eos_ids(model, tokenizer) -> list[int]:
    """The ids generate() bans under min_new_tokens (generation config's EOS), else the tokenizer's EOS."""
    ids = model.generation_config.eos_token_id
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def pick(eos, logits):
    """Greedy next tokens from logits [N, 1, V], EOS banned since output lengths are exact: (on the
    device [N], on the host)."""
    scores = logits[:, -1]  # [N, V]
    if eos.numel():
        scores = scores.index_fill(-1, eos, float("-inf"))
    tokens = scores.argmax(-1)  # [N]
    return tokens, tokens.tolist()  # the host read (a CUDA sync): the tokens exist from here


def emit(lives: list[HFContinuousRequest], tokens: list[int], t: float, out: StepOutput) -> None:
    """Append each row's token, stamped `t` (when it reached the host), and note rows now done."""
    for lv, token in zip(lives, tokens):
        lv.context.append(token)
        lv.generated += 1
        out.request_ids.append(lv.row.request_id)
        out.token_ids.append(token)
        out.times.append(t)
        if lv.remaining() <= 0:
            out.finished.append(lv.row.request_id)


def filled(lives: list[HFContinuousRequest], counts: list[int], out: StepOutput) -> list[HFContinuousRequest]:
    """Count the chunks that ran; the rows now fully prefilled (the oldest: only the last chunk can be
    partial)."""
    out.prefill_rows, out.prefill_width, out.prefill_pairs = chunk_shape([lv.filled for lv in lives], counts)
    for lv, n in zip(lives, counts):
        lv.filled += n
    out.prefill_tokens = sum(counts)
    return [lv for lv in lives if not lv.unfilled()]
