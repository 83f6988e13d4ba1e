"""A left-padded batched KV cache for continuous batching on the Hugging Face worker (see worker.hf.continuous)."""


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
