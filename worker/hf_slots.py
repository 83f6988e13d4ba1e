"""A slot KV cache for continuous batching on the Hugging Face worker (see hf_continuous).

Per layer, K and V are one tensor each, [slots, kv_heads, columns, head_dim], allocated once and grown
only when an admitted row's final length (known at admission: context + remaining tokens) or the row
count outgrows it. Running row i lives in slot i. Row i's real tokens sit in columns [start[i], col[i]),
where start[i] is its left padding from a batched prefill and col[i] the column its next token is written
to; its rotary position is col[i] − start[i]. A decode step writes each row's new K/V in place at col[i]
(one scatter per layer), attends over the first W = max(col) + 1 columns (a view, no copy) masked per row
to [start[i], col[i]], and advances col in place. A joiner is prefilled straight into the next free slots.
A finished row frees its slot: the highest running row moves into the hole (one row's columns per layer),
so running rows always fill slots 0..R−1 and a decode forward needs no gather.

Per-step state (last tokens, start, col) lives on the device; the host keeps mirrors of start and col
(they follow deterministically), so a decode step copies nothing host→device and reads back only its tokens.

Attention: decode (one query per row) goes through `slot_attention`, registered with transformers'
AttentionInterface: the query heads of one KV head are laid out as that head's G queries ([R, Hkv, G, D]),
so SDPA reads the cached K/V once per KV head, never repeated (repeat_kv would copy them G times, 41% of a
CPU decode step). Every other call (prefill, generate()) falls through to transformers' own SDPA function.
"""

ATTENTION = "batchlab_slots"  # the model's attention implementation name while the slot loop owns it
COLUMN_BLOCK = 256  # columns are allocated in blocks of this many tokens


def slot_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                   slot_decode: bool = False, **kwargs):
    """Grouped-query decode without copies when `slot_decode`; else transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not slot_decode:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    import torch

    rows, heads, _, dim = query.shape  # query [R, Hq, 1, D]; key, value [R, Hkv, W, D]
    grouped = query.reshape(rows, key.shape[1], heads // key.shape[1], dim)  # [R, Hkv, G, D]: head h = kv·G + g
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           scale=scaling)  # [R, Hkv, G, D]
    return out.reshape(rows, 1, heads, dim), None  # [R, 1, Hq, D], as sdpa_attention_forward returns


def use_slot_attention(model) -> None:
    """Register slot_attention (and SDPA's mask builder under its name) and switch `model` to it."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(ATTENTION, slot_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)


class SlotKV:
    """Per-layer K/V slots, row i of the running set in slot i (see the module docstring); a transformers
    cache as far as the model's forward needs one (`update`, `get_seq_length`)."""

    is_compileable = False

    def __init__(self, torch, device, dtype, layers: int, kv_heads: int, head_dim: int) -> None:
        self.torch, self.device, self.dtype = torch, device, dtype
        self.shape = (layers, kv_heads, head_dim)
        self.clear()

    def clear(self) -> None:
        """Drop every row and the tensors."""
        self.keys, self.values = [], []
        self.slots = self.columns = 0
        self.tokens = self.start = self.col = self.cols = None  # device [slots] ×3, [columns]
        self.start_h: list[int] = []  # host mirrors of start and col for the running rows
        self.col_h: list[int] = []
        self.joining = 0  # slots after the running rows written by the last prefill, not yet committed
        self.joining_pads: list[int] = []  # their left padding
        self.mode, self.index, self.width = "", None, 0

    @property
    def rows(self) -> int:
        """Running rows (slots 0..rows−1)."""
        return len(self.col_h)

    def widest(self) -> int:
        """The running rows' widest column count (what the next decode attends over, less one)."""
        return max(self.col_h, default=0)

    # --- allocation -----------------------------------------------------------------------------------
    def reserve(self, slots: int, columns: int, slot_limit: int) -> None:
        """Grow (copying the running rows) so `slots` rows of `columns` columns fit; no-op when they do."""
        if slots <= self.slots and columns <= self.columns:
            return
        torch, (layers, heads, dim) = self.torch, self.shape
        slots, columns = self._grown(slots, columns, slot_limit)
        rows, used = self.rows, self.widest()
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
        self.tokens, self.start, self.col = (self._grow_state(t, slots) for t in (self.tokens, self.start, self.col))
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
        col, start = self.col[:rows], self.start[:rows]
        self.mode, self.width = "decode", self.widest() + 1
        self.index = col.view(rows, 1, 1, 1).expand(rows, heads, 1, dim)  # where each row's new K/V goes
        cols = self.cols[: self.width]  # [W]
        mask = (cols >= start[:, None]) & (cols <= col[:, None])  # [R, W]: the row's tokens and the new one
        return {"input_ids": self.tokens[:rows, None], "position_ids": (col - start)[:, None],
                "attention_mask": mask[:, None, None, :], "slot_decode": True}

    def decoded(self, tokens) -> None:
        """After a decode: tokens [R] (device) are the rows' next inputs; every row moved one column on."""
        rows = self.rows
        self.tokens[:rows].copy_(tokens)
        self.col[:rows] += 1
        self.col_h = [c + 1 for c in self.col_h]

    # --- one prefill forward ----------------------------------------------------------------------------
    def prefill_inputs(self, ids: list[list[int]], pads: list[int]) -> dict:
        """The model's keyword arguments to prefill left-padded `ids` [J, S] into the slots after the running rows."""
        torch = self.torch
        width = len(ids[0])
        self.mode, self.width, self.joining, self.joining_pads = "prefill", width, len(ids), pads
        input_ids = torch.tensor(ids, device=self.device)  # [J, S]
        pad = torch.tensor(pads, device=self.device)  # [J]
        cols = torch.arange(width, device=self.device)  # [S]
        real = cols[None, :] >= pad[:, None]  # [J, S]
        causal = cols[None, :] <= cols[:, None]  # [S, S]: query row, key column
        # a padding query sees only itself, so no row is fully masked (its K/V stay finite, and are never read)
        mask = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.device)[None]
        return {"input_ids": input_ids, "position_ids": (cols[None, :] - pad[:, None]).clamp(min=0),
                "attention_mask": mask[:, None]}  # mask [J, 1, S, S]

    def prefilled(self, tokens) -> None:
        """Commit the prefilled joiners as running rows: tokens [J] (device) are their next inputs."""
        first, count, width = self.rows, self.joining, self.width
        self.tokens[first:first + count].copy_(tokens)
        self.start[first:first + count].copy_(self.torch.tensor(self.joining_pads, device=self.device))
        self.col[first:first + count] = width
        self.start_h += self.joining_pads
        self.col_h += [width] * count
        self.joining = 0

    # --- the transformers cache interface ------------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the forward's new K/V [N, Hkv, S, D] in place; return what this layer attends over."""
        k, v = self.keys[layer_idx], self.values[layer_idx]
        rows = self.rows
        if self.mode == "decode":
            k[:rows].scatter_(2, self.index, key_states)
            v[:rows].scatter_(2, self.index, value_states)
            return k[:rows, :, : self.width], v[:rows, :, : self.width]
        k[rows:rows + self.joining, :, : self.width].copy_(key_states)
        v[rows:rows + self.joining, :, : self.width].copy_(value_states)
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns the current forward attends over."""
        return self.width

    # --- rows leaving -----------------------------------------------------------------------------------
    def release(self, done: list[int]) -> list[int]:
        """Free the running slots `done`; the highest rows move into the holes. Returns the new order
        (old slot of each new slot), for the caller's row list."""
        keep = [i for i in range(self.rows) if i not in set(done)]
        holes = [i for i in done if i < len(keep)]
        movers = [i for i in keep if i >= len(keep)]
        order = list(range(len(keep)))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if holes:
            self._move(movers, holes)
        self.start_h = [self.start_h[i] for i in order]
        self.col_h = [self.col_h[i] for i in order]
        return order

    def _move(self, movers: list[int], holes: list[int]) -> None:
        src = self.torch.tensor(movers, device=self.device)
        dst = self.torch.tensor(holes, device=self.device)
        used = max(self.col_h[i] for i in movers)
        for t in self.keys + self.values:
            t[:, :, :used].index_copy_(0, dst, t[:, :, :used].index_select(0, src))
        for t in (self.tokens, self.start, self.col):
            t.index_copy_(0, dst, t.index_select(0, src))
