"""A slot KV cache for continuous batching on the Hugging Face worker (see worker.hf.continuous).

The layout and why (docs/workers.md, "Continuous batching on the Hugging Face worker"): per layer one K
and one V tensor [slots, kv_heads, columns, head_dim], grown only when an admitted row's final length
(context + remaining tokens) or the row count outgrows it. Slots 0..R−1 hold the running rows, slots
R..R+P−1 the rows still being prefilled (oldest first). A row's tokens sit in columns [0, fill), its
rotary position is its column. A decode step writes each running row's new K/V in place at its column
(one scatter per layer), attends over the first W = max(col) + 1 columns (a view, no copy) masked per
row, and advances col in place.

A prefill forward runs a chunk of each of the oldest J prefilling rows (a whole prompt when prefill is
not chunked), left-padded to [J, C]: each real token is scattered to its own column (after the row's
earlier chunks) and attends causally over the row's columns up to its own; a padding token is scattered to
a column past the row's chunk (one a later chunk or decode overwrites before anything reads it), so no
token's K/V lands on a real one. When a row's last chunk has run, the row joins the running rows where
it already sits (slot R). A finished row frees its slot: the highest running row moves into the hole
and the prefilling rows move down behind the running ones (their filled columns), so a decode forward
needs no gather and a prefill forward reads its J rows as one view.

A fused forward (the default when both are due in one step) runs the decodes and the chunks over the
packed tokens [1, R + ΣC], each token's K/V written at (its slot, its column); attention splits per kind.

Per-step state (last tokens, col) lives on the device; the host keeps mirrors of the fills (they follow
deterministically), so a decode step copies nothing host→device and reads back only its tokens.

Attention: decode (one query per row) goes through `slot_attention`, registered with transformers'
AttentionInterface: the query heads of one KV head are laid out as that head's G queries ([R, Hkv, G, D]),
so SDPA reads the cached K/V once per KV head, never repeated (repeat_kv would copy them G times, 41% of a
CPU decode step). Every other call (prefill, generate()) falls through to transformers' own SDPA function.
"""
from dataclasses import dataclass

ATTENTION = "batchlab_slots"  # the model's attention implementation name while the slot loop owns it
COLUMN_BLOCK = 256  # columns are allocated in blocks of this many tokens


def slot_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                   slot_decode: bool = False, slot_fused: "FusedPlan | None" = None, **kwargs):
    """Grouped-query decode without copies when `slot_decode`, a fused step's split attention when `slot_fused`;
    else transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if slot_fused is not None:
        return _fused_attention(query, key, value, attention_mask, scaling, slot_fused), None
    if not slot_decode:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    rows, heads, _, dim = query.shape  # query [R, Hq, 1, D]; key, value [R, Hkv, W, D]
    return _grouped_decode(query[:, :, 0], key, value, attention_mask, scaling).reshape(rows, 1, heads, dim), None


def _grouped_decode(query, key, value, mask, scaling):
    """One query per row [R, Hq, D] over its own K/V [R, Hkv, W, D], masked [R, 1, 1, W]: out [R, Hq, D]. The
    query heads of a KV head are laid out as that head's G queries, so K/V are read once, never repeated."""
    import torch

    rows, heads, dim = query.shape
    grouped = query.reshape(rows, key.shape[1], heads // key.shape[1], dim)  # [R, Hkv, G, D]: head h = kv·G + g
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, dim)


def _fused_attention(query, key, value, mask, scaling, plan: "FusedPlan"):
    """Packed queries [1, Hq, T, D] (the R decodes, then each chunk) over the whole cache [S, Hkv, C, D]:
    out [1, T, Hq, D], as sdpa_attention_forward returns."""
    import torch

    rows, width = plan.rows, plan.decode_width
    parts = [_grouped_decode(query[0, :, :rows].transpose(0, 1), key[:rows, :, :width], value[:rows, :, :width],
                             mask, scaling)] if rows else []  # [R, Hq, D]
    for j, (start, n, fill) in enumerate(plan.chunks):
        slot, seen = rows + j, fill + n
        out = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:start + n], key[slot:slot + 1, :, :seen], value[slot:slot + 1, :, :seen],
            attn_mask=plan.masks[j], scale=scaling, enable_gqa=True)  # [1, Hq, n, D]
        parts.append(out[0].transpose(0, 1))  # [n, Hq, D]
    return torch.cat(parts)[None]  # [1, T, Hq, D]


@dataclass(slots=True)
class FusedPlan:
    """A fused forward's layout in the packed tokens: the first `rows` are the running rows' decodes (attending
    over `decode_width` columns, masked by the forward's attention_mask); then per chunk (start, tokens, the
    row's columns filled before it), chunk j in slot rows + j, with its causal mask [tokens, fill + tokens]."""

    rows: int
    decode_width: int
    chunks: list[tuple[int, int, int]]
    masks: list


def use_slot_attention(model) -> None:
    """Register slot_attention (and SDPA's mask builder under its name) and switch `model` to it."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, slot_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)


class SlotKV:
    """Per-layer K/V slots: running row i in slot i, prefilling row p in slot R + p (see the module
    docstring); a transformers cache as far as the model's forward needs one (`update`, `get_seq_length`)."""

    is_compileable = False

    def __init__(self, torch, device, dtype, layers: int, kv_heads: int, head_dim: int) -> None:
        self.torch, self.device, self.dtype = torch, device, dtype
        self.shape = (layers, kv_heads, head_dim)
        self.clear()

    def clear(self) -> None:
        """Drop every row and the tensors."""
        self.keys, self.values = [], []
        self.slots = self.columns = 0
        self.tokens = self.col = self.cols = None  # device [slots] ×2, [columns]
        self.col_h: list[int] = []  # host mirror of col for the running rows: the column each writes next
        self.fill_h: list[int] = []  # the prefilling rows' filled columns, oldest first
        self.mode, self.index, self.width, self.chunk, self.plan = "", None, 0, [], None

    @property
    def rows(self) -> int:
        """Running rows (slots 0..rows−1)."""
        return len(self.col_h)

    @property
    def prefilling(self) -> int:
        """Rows being prefilled (slots rows..rows+prefilling−1)."""
        return len(self.fill_h)

    def widest(self) -> int:
        """The running rows' widest column count (what the next decode attends over, less one)."""
        return max(self.col_h, default=0)

    # --- allocation -----------------------------------------------------------------------------------
    def reserve(self, slots: int, columns: int, slot_limit: int) -> None:
        """Grow (copying the occupied slots) so `slots` rows of `columns` columns fit; no-op when they do."""
        if slots <= self.slots and columns <= self.columns:
            return
        torch, (layers, heads, dim) = self.torch, self.shape
        slots, columns = self._grown(slots, columns, slot_limit)
        rows, used = min(self.rows + self.prefilling, self.slots), max(self.col_h + self.fill_h, default=0)
        keys, values = [], []
        for old_k, old_v in zip(self.keys or [None] * layers, self.values or [None] * layers):
            k = torch.zeros(slots, heads, columns, dim, dtype=self.dtype, device=self.device)
            v = torch.zeros_like(k)
            if old_k is not None and rows:
                k[:rows, :, :used].copy_(old_k[:rows, :, :used])
                v[:rows, :, :used].copy_(old_v[:rows, :, :used])
            keys.append(k)
            values.append(v)
        self.keys, self.values = keys, values
        self.tokens, self.col = (self._grow_state(t, slots) for t in (self.tokens, self.col))
        self.cols = torch.arange(columns, device=self.device)
        self.slots, self.columns = slots, columns

    def _grown(self, slots: int, columns: int, slot_limit: int) -> tuple[int, int]:
        slots = slots if slots <= self.slots else max(slots, min(2 * self.slots, slot_limit))
        columns = max(columns, self.columns)
        return max(slots, self.slots), -(-columns // COLUMN_BLOCK) * COLUMN_BLOCK

    def _grow_state(self, old, slots: int):
        new = self.torch.zeros(slots, dtype=self.torch.long, device=self.device)
        if old is not None:
            new[: old.shape[0]].copy_(old)
        return new

    # --- one decode forward -----------------------------------------------------------------------------
    def decode_inputs(self) -> dict:
        """The model's keyword arguments for one decode step over the running rows (all device-resident)."""
        rows, (_, heads, dim) = self.rows, self.shape
        col = self.col[:rows]
        self.mode, self.width = "decode", self.widest() + 1
        self.index = col.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)  # where each row's new K/V goes
        mask = self.cols[: self.width] <= col[:, None]  # [R, W]: the row's tokens and the new one
        return {"input_ids": self.tokens[:rows, None], "position_ids": col[:, None],
                "attention_mask": mask[:, None, None, :], "slot_decode": True}

    def decoded(self, tokens) -> None:
        """After a decode: tokens [R] (device) are the rows' next inputs; every row moved one column on."""
        rows = self.rows
        self.tokens[:rows].copy_(tokens)
        self.col[:rows] += 1
        self.col_h = [c + 1 for c in self.col_h]

    # --- prefill forwards ---------------------------------------------------------------------------------
    def add(self, count: int) -> None:
        """`count` rows start prefilling in the next free slots (reserve them first)."""
        self.fill_h += [0] * count

    def prefill_inputs(self, chunks: list[list[int]], pad_id: int) -> dict:
        """The model's keyword arguments to run chunks[j] (token ids, ≥ 1) of prefilling row j, for the oldest
        len(chunks) rows, left-padded with `pad_id` to [J, C]."""
        torch, (_, heads, dim) = self.torch, self.shape
        width, fills = max(len(c) for c in chunks), self.fill_h[: len(chunks)]
        pads = [width - len(c) for c in chunks]
        # target[j, p]: the column input p of row j writes; a real token goes after the row's filled
        # columns, a padding one past the row's chunk (a later chunk or decode overwrites it before any read)
        target = [[f + p - pad if p >= pad else f + len(c) + p for p in range(width)]
                  for f, pad, c in zip(fills, pads, chunks)]
        index = torch.tensor(target, device=self.device)  # [J, C]
        self.mode, self.chunk = "prefill", [len(c) for c in chunks]
        self.width = max(f + width for f in fills)  # columns the forward attends over (and writes, at most)
        self.index = index[:, None, :, None].expand(len(chunks), heads, width, dim)
        mask = self.cols[: self.width] <= index[:, :, None]  # [J, C, W]: causal over the row's own columns
        ids = torch.tensor([[pad_id] * pad + c for pad, c in zip(pads, chunks)], device=self.device)  # [J, C]
        return {"input_ids": ids, "position_ids": index, "attention_mask": mask[:, None]}  # mask [J, 1, C, W]

    # --- one fused forward: the decodes and the chunks together -------------------------------------------
    def fused_inputs(self, chunks: list[list[int]]) -> dict:
        """The model's keyword arguments for one forward over the running rows' decodes and chunks[j] of the
        oldest prefilling rows, packed as [1, R + ΣC] (see the module docstring); `fused_ends()` are the packed
        positions of each row's last token (the logits to keep). After it: decoded(), then prefilled()."""
        torch, rows = self.torch, self.rows
        fills = self.fill_h[: len(chunks)]
        col = self.col[:rows]
        decode_width = self.widest() + 1
        spans, start = [], rows
        for fill, c in zip(fills, chunks):
            spans.append((start, len(c), fill))
            start += len(c)
        columns = torch.tensor([f + p for f, c in zip(fills, chunks) for p in range(len(c))], device=self.device)
        slots = torch.tensor([rows + j for j, c in enumerate(chunks) for _ in c], device=self.device)
        self.mode, self.chunk = "fused", [len(c) for c in chunks]
        self.width = max([decode_width] + [f + n for _, n, f in spans])
        self.index = (torch.cat([torch.arange(rows, device=self.device), slots]), torch.cat([col, columns]))
        masks = [self.cols[: f + n] <= (f + self.cols[:n])[:, None] for _, n, f in spans]  # [n, f + n] causal
        self.plan = FusedPlan(rows, decode_width, spans, masks)
        ids = torch.cat([self.tokens[:rows], torch.tensor([t for c in chunks for t in c], device=self.device)])
        mask = self.cols[:decode_width] <= col[:, None]  # [R, W]: the decodes' mask, as decode_inputs'
        return {"input_ids": ids[None], "position_ids": self.index[1][None], "attention_mask": mask[:, None, None, :],
                "slot_fused": self.plan}

    def fused_ends(self) -> list[int]:
        """Packed positions of each running row's decode, then of each chunk's last token."""
        return list(range(self.plan.rows)) + [start + n - 1 for start, n, _ in self.plan.chunks]

    def prefilled(self, tokens, done: int) -> None:
        """After a prefill forward: the oldest `done` rows have run their last chunk and join the running
        rows (where they already sit), tokens [done] (device) their next inputs."""
        self.fill_h[: len(self.chunk)] = [f + n for f, n in zip(self.fill_h, self.chunk)]
        first, fills = self.rows, self.fill_h[:done]
        if done:
            self.tokens[first:first + done].copy_(tokens)
            self.col[first:first + done].copy_(self.torch.tensor(fills, device=self.device))
        self.col_h += fills
        self.fill_h = self.fill_h[done:]
        self.chunk = []

    def drop_prefilling(self) -> None:
        """Forget the prefilling rows (their slots are free again)."""
        self.fill_h, self.chunk = [], []

    # --- the transformers cache interface ------------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the forward's new K/V [N, Hkv, S, D] in place; return what this layer attends over."""
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.mode == "fused":  # token t of the packed forward goes to (slot, column) index[0][t], index[1][t]
            k.transpose(1, 2).index_put_(self.index, key_states[0].transpose(0, 1))  # [T, Hkv, D]
            v.transpose(1, 2).index_put_(self.index, value_states[0].transpose(0, 1))
            return k, v
        first = self.rows if self.mode == "prefill" else 0
        rows = slice(first, first + key_states.shape[0])
        k[rows].scatter_(2, self.index, key_states)
        v[rows].scatter_(2, self.index, value_states)
        return k[rows, :, : self.width], v[rows, :, : self.width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns the current forward attends over."""
        return self.width

    # --- rows leaving -----------------------------------------------------------------------------------
    def release(self, done: list[int]) -> list[int]:
        """Free the running slots `done`; the highest running rows move into the holes and the prefilling
        rows move down behind them. Returns the running rows' new order (old slot of each new slot)."""
        keep = [i for i in range(self.rows) if i not in set(done)]
        holes = [i for i in done if i < len(keep)]
        movers = [i for i in keep if i >= len(keep)]
        order = list(range(len(keep)))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        behind = list(range(self.rows, self.rows + self.prefilling))  # old slots of the prefilling rows
        moves = [(old, new) for new, old in enumerate(order + behind) if old != new]
        if moves:
            self._move(moves, [self.col_h[i] for i in movers] + self.fill_h)
        self.col_h = [self.col_h[i] for i in order]
        return order

    def _move(self, moves: list[tuple[int, int]], fills: list[int]) -> None:
        src = self.torch.tensor([old for old, _ in moves], device=self.device)
        dst = self.torch.tensor([new for _, new in moves], device=self.device)
        used = max(fills, default=0)
        for t in self.keys + self.values:  # index_select copies first, so overlapping moves are safe
            t[:, :, :used].index_copy_(0, dst, t[:, :, :used].index_select(0, src))
        for t in (self.tokens, self.col):
            t.index_copy_(0, dst, t.index_select(0, src))
