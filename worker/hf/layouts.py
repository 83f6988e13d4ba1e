"""The two KV layouts the continuous HF loop can run on (worker.hf.continuous): `slots` (the default,
worker.hf.slots.SlotKV) and `padded` (the earlier left-padded DynamicCache, PaddedKV here).

A layout owns the cache and the model inputs; the loop owns rows, tokens, stamps and memory policy.
Per step the loop calls add (rows admitted to prefill), then decode → decoded (if running rows) and prefill →
prefilled (if a chunk runs; the oldest `done` prefilling rows ran their last one and now run), or, where the
layout has it and both are due, fused → decoded → prefilled (one forward for both), then release,
which returns the running rows' new order as indices into running + rows that just finished prefilling.
Only the slot layout prefills in chunks; the padded one prefills each joiner whole in the step it joins.
"""
from batchlab.worker.backend import BackendError
from batchlab.worker.hf.slots import SlotKV, use_slot_attention
from batchlab.worker.hf.static import left_pad
from batchlab.worker.memory import kv_shape

DESCRIPTIONS = {  # the worker fact "decode": how each layout runs a step
    "slots": "greedy loop, EOS banned: one forward per step for the running rows' decodes and the joiners' prompt "
             "chunks (within a per-step token budget) into free slots of a preallocated per-row KV cache, "
             "grouped-query decode attention",
    "padded": "greedy loop, EOS banned: one batched decode forward per step, joiners prefilled together, "
              "left-padded DynamicCache"}


class SlotLayout(SlotKV):
    """Running row i in slot i of a preallocated cache (SlotKV: the bookkeeping, and the model's cache); decode
    inputs and state stay on the device; a step with both decodes and chunks runs them as one fused forward."""

    def __init__(self, torch, model, device, max_rows: int) -> None:
        super().__init__(torch, device, model.dtype, *kv_shape(model.config))
        self.max_rows = max_rows
        use_slot_attention(model)

    def decode(self, model, running):
        return model(**self.decode_inputs(), past_key_values=self, use_cache=True).logits  # [R, 1, V]

    def prefill(self, model, chunks, running, prefilling, pad_id: int):
        """Run chunks[j] of prefilling row j: logits [J, 1, V] at each chunk's last token."""
        self._reserve(chunks, running, prefilling)
        return model(**self.prefill_inputs(chunks, pad_id), past_key_values=self, use_cache=True,
                     logits_to_keep=1).logits  # [J, 1, V]

    def fused(self, model, chunks, running, prefilling):
        """One forward: the running rows' decodes and chunks[j] of prefilling row j; logits [R + J, 1, V] (each
        running row's, then each chunk's last token's). Then decoded() and prefilled(), in that order."""
        self._reserve(chunks, running, prefilling)
        inputs = self.fused_inputs(chunks)
        keep = self.torch.tensor(self.fused_ends(), device=self.device)
        return model(**inputs, past_key_values=self, use_cache=True, logits_to_keep=keep).logits.transpose(0, 1)

    def _reserve(self, chunks, running, prefilling) -> None:
        """Room for every row's final length and a padding token's column past each chunk."""
        rows = len(running) + len(prefilling)
        ends = [c + lv.remaining() for c, lv in zip(self.col_h, running)]
        ends += [len(lv.context) + lv.remaining() for lv in prefilling]
        ends += [f + max(len(c) for c in chunks) for f in self.fill_h[: len(chunks)]]  # a padding token's column
        self.reserve(rows, max(ends), max(self.max_rows, rows))


class PaddedKV:
    """A left-padded batched DynamicCache: keys/values [B, H, T, D]; row i is real from column pad[i]."""

    def __init__(self, torch, device) -> None:
        self.torch, self.device = torch, device
        self.cache = None
        self.pad: list[int] = []

    def width(self) -> int:
        """T, the cache's column count."""
        return self.cache.get_seq_length() if self.cache is not None else 0

    def mask(self, extra: int):
        """attention_mask [B, T + extra]: 1 where a row has a real token (or a new one)."""
        cols = self.torch.arange(self.width() + extra, device=self.device)  # [T + extra]
        pad = self.torch.tensor(self.pad, device=self.device)  # [B]
        return (cols[None, :] >= pad[:, None]).long()

    def positions(self):
        """position_ids [B, 1] of the next token: each row's real length."""
        t = self.width()
        return self.torch.tensor([[t - p] for p in self.pad], device=self.device)

    def select(self, keep: list[int]) -> None:
        """Keep rows `keep` (in order) and drop columns that are padding for all of them."""
        if not keep:
            self.cache, self.pad = None, []
            return
        cut = min(self.pad[i] for i in keep)
        index = self.torch.tensor(keep, device=self.device)
        self._map(lambda x: x.index_select(0, index)[:, :, cut:])
        self.pad = [self.pad[i] - cut for i in keep]

    def merge(self, other: "PaddedKV") -> None:
        """Append `other`'s rows below ours, left-padding whichever cache is narrower."""
        if self.cache is None:
            self.cache, self.pad = other.cache, list(other.pad)
            return
        width = max(self.width(), other.width())
        self.widen(width)
        other.widen(width)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = self.torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = self.torch.cat([mine.values, theirs.values], dim=0)
        self.pad += other.pad

    def widen(self, width: int) -> None:
        """Left-pad every row with zero columns up to `width`."""
        extra = width - self.width()
        if extra > 0:
            self._map(lambda x: self.torch.nn.functional.pad(x, (0, 0, extra, 0)))
            self.pad = [p + extra for p in self.pad]

    def _map(self, fn) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = fn(layer.keys), fn(layer.values)


class PaddedLayout:
    """One left-padded DynamicCache for the running rows; joiners get their own, merged in at release."""

    fused = None  # no fused forward: a decode and a prefill forward

    def __init__(self, torch, model, device, max_rows: int) -> None:
        self.torch, self.device = torch, device
        self.kv, self.joined, self.pending = PaddedKV(torch, device), None, None  # running; joined; prefilled

    def widest(self) -> int:
        return self.kv.width()

    def decode(self, model, running):
        last = self.torch.tensor([[lv.context[-1]] for lv in running], device=self.device)  # [R, 1]
        return model(input_ids=last, attention_mask=self.kv.mask(1), position_ids=self.kv.positions(),
                     past_key_values=self.kv.cache, use_cache=True).logits  # [R, 1, V]

    def decoded(self, tokens) -> None:
        """Nothing: the next decode reads the tokens from the rows' contexts."""

    def add(self, count: int) -> None:
        """Nothing: joiners get their own cache at prefill."""

    def prefill(self, model, chunks, running, prefilling, pad_id: int):
        """Prefill the joiners whole (this layout does not chunk): logits [J, 1, V]."""
        from transformers import DynamicCache

        joiners = prefilling[: len(chunks)]
        if [len(c) for c in chunks] != [len(lv.context) for lv in joiners]:
            raise BackendError("the padded KV layout prefills whole prompts only (no --max-num-batched-tokens)")
        ids, mask = left_pad([lv.context for lv in joiners], pad_id)
        input_ids = self.torch.tensor(ids, device=self.device)  # [J, S]
        attention_mask = self.torch.tensor(mask, device=self.device)  # [J, S]
        kv = PaddedKV(self.torch, self.device)
        kv.cache, kv.pad = DynamicCache(), [len(ids[0]) - len(lv.context) for lv in joiners]
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0), past_key_values=kv.cache,
                       use_cache=True, logits_to_keep=1).logits  # [J, 1, V]
        self.pending = kv
        return logits

    def prefilled(self, tokens, done: int) -> None:
        self.joined, self.pending = self.pending, None

    def drop_prefilling(self) -> None:
        self.pending = None

    def release(self, done: list[int]) -> list[int]:
        running = len(self.kv.pad)
        joined = len(self.joined.pad) if self.joined is not None else 0
        keep = [i for i in range(running) if i not in done]
        if len(keep) < running:
            self.kv.select(keep)
        stay = [j for j in range(joined) if running + j not in done]
        if stay:
            self.joined.select(stay)
            self.kv.merge(self.joined)
        self.joined = None
        return keep + [running + j for j in stay]

    def clear(self) -> None:
        self.kv, self.joined = PaddedKV(self.torch, self.device), None


LAYOUTS = {"slots": SlotLayout, "padded": PaddedLayout}  # by name, each built as (torch, model, device, max_rows)


def sliding_window(torch, model, device, pad_id: int) -> int:
    """The model's sliding window (tokens; 0: full attention), after checking that every layer is full
    attention or a sliding window (Mistral-7B's 4096): inside the window such a model is the same model, and
    the loop refuses rows that would outgrow it (it attends over every key it keeps)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    with torch.inference_mode():
        layers = model(input_ids=torch.tensor([[pad_id]], device=device), use_cache=True).past_key_values.layers
    if any(type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
        raise BackendError("continuous hf needs full-attention or sliding-window caches, got "
                           f"{sorted({type(layer).__name__ for layer in layers})}")
    # whether transformers built sliding-window layers depends on its config's layer_types
    return int(getattr(model.config.get_text_config(), "sliding_window", None) or 0)
