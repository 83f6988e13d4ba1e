"""The two KV layouts the continuous HF loop can run on (worker.hf_continuous): `slots` (the default,
worker.hf_slots.SlotKV) and `padded` (the earlier left-padded DynamicCache, worker.hf_kv.PaddedKV).

A layout owns the cache and the model inputs; the loop owns rows, tokens, stamps and memory policy.
Per step the loop calls decode → decoded (if running rows), prefill → prefilled (if joiners), then
retire, which returns the running rows' new order as indices into running + committed joiners.
"""
from batchlab.worker.hf import left_pad
from batchlab.worker.hf_kv import PaddedKV
from batchlab.worker.hf_slots import SlotKV, use_slot_attention

LAYOUTS = ("slots", "padded")


class SlotLayout:
    """Running row i in slot i of a preallocated cache; decode inputs and state stay on the device."""

    def __init__(self, torch, model, device, max_rows: int) -> None:
        from batchlab.worker.memory import kv_shape

        layers, kv_heads, head_dim = kv_shape(model.config)
        self.kv = SlotKV(torch, device, model.dtype, layers, kv_heads, head_dim)
        self.max_rows = max_rows
        use_slot_attention(model)

    def width(self) -> int:
        return self.kv.widest()

    def decode(self, model, running):
        return model(**self.kv.decode_inputs(), past_key_values=self.kv, use_cache=True).logits  # [R, 1, V]

    def decoded(self, tokens) -> None:
        self.kv.decoded(tokens)

    def prefill(self, model, joiners, running, pad_id: int):
        ids, _ = left_pad([lv.context for lv in joiners], pad_id)
        pads = [len(ids[0]) - len(lv.context) for lv in joiners]
        ends = [c + lv.remaining() for c, lv in zip(self.kv.col_h, running)]
        ends += [len(ids[0]) + lv.remaining() for lv in joiners]
        self.kv.reserve(len(running) + len(joiners), max(ends), max(self.max_rows, len(running) + len(joiners)))
        return model(**self.kv.prefill_inputs(ids, pads), past_key_values=self.kv, use_cache=True,
                     logits_to_keep=1).logits  # [J, 1, V]

    def prefilled(self, tokens) -> None:
        self.kv.prefilled(tokens)

    def retire(self, done: list[int]) -> list[int]:
        return self.kv.release(done)

    def clear(self) -> None:
        self.kv.clear()


class PaddedLayout:
    """One left-padded DynamicCache for the running rows; joiners get their own, merged in at retire."""

    def __init__(self, torch, model, device, max_rows: int) -> None:
        self.torch, self.device = torch, device
        self.kv, self.joined, self.pending = PaddedKV(torch, device), None, None  # running; joined; prefilled

    def width(self) -> int:
        return self.kv.width()

    def decode(self, model, running):
        last = self.torch.tensor([[lv.context[-1]] for lv in running], device=self.device)  # [R, 1]
        return model(input_ids=last, attention_mask=self.kv.mask(1), position_ids=self.kv.positions(),
                     past_key_values=self.kv.cache, use_cache=True).logits  # [R, 1, V]

    def decoded(self, tokens) -> None:
        """Nothing: the next decode reads the tokens from the rows' contexts."""

    def prefill(self, model, joiners, running, pad_id: int):
        from transformers import DynamicCache

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

    def prefilled(self, tokens) -> None:
        self.joined, self.pending = self.pending, None

    def retire(self, done: list[int]) -> list[int]:
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


def make_layout(name: str, torch, model, device, max_rows: int):
    """The layout called `name` (one of LAYOUTS)."""
    return {"slots": SlotLayout, "padded": PaddedLayout}[name](torch, model, device, max_rows)
