"""The LM head at the row counts it runs fastest.

A decode step's largest matrix product is the LM head: [rows, hidden] × [hidden, vocab]. Its time is not
monotonic in the rows. On this project's 2-core CPU (torch 2.13, float32, tiny-mistral's 512 × 32,000 head)
it took 8.4 ms for 1 row, 16.4 for 2, 23.8 for 3, but 14.0 for 4 and 12.1 for 5: the kernel picked for 2
or 3 rows reads the weights once per row, the one for 4 and up once per block. A continuous batch that runs
2 or 3 rows (what it mostly runs at moderate load) paid ~10 ms a step more than a static batch of 8.

So the head is timed once at warm-up for every row count up to the worker's row cap (`head_times`, fastest
of a few repeats), and a forward with m rows computes m' ≥ m rows (zero rows appended, their logits dropped)
where m' is the fastest count at or above m (`pad_table`; only a gain of at least MIN_GAIN counts, so noise
does not move a count). Hooks on the model's own head module do it, so `generate()` (static batches) and the
continuous loop both get it and the weights stay tied. The real rows' logits are the same products; only the
kernel's summation order may differ, as it already does between batch sizes.
"""
from collections.abc import Callable

MIN_GAIN = 0.9  # a count m' > m is taken only if it is at least 10% faster than m itself
TIMING_REPEATS = 3
MAX_TIMED_ROWS = 64  # counts above are run as they are (a big head on a CPU takes ~0.1 s a call to time)


def pad_table(times_s: list[float]) -> list[int]:
    """times_s[m - 1]: the head's time for m rows → table[m]: the rows to compute for m (table[0] = 0)."""
    table = [0]
    for m in range(1, len(times_s) + 1):
        best = min(range(m, len(times_s) + 1), key=lambda k: times_s[k - 1])
        table.append(best if times_s[best - 1] <= MIN_GAIN * times_s[m - 1] else m)
    return table


def head_times(head, rows: int, hidden: int, device, dtype, sync: Callable[[], None], clock) -> list[float]:
    """The head's time for 1..rows rows of zeros (fastest of TIMING_REPEATS, after one untimed call each)."""
    import torch

    times = []
    with torch.inference_mode():
        for m in range(1, rows + 1):
            x = torch.zeros(m, hidden, device=device, dtype=dtype)
            head(x)
            best = float("inf")
            for _ in range(TIMING_REPEATS):
                sync()
                start = clock()
                head(x)
                sync()
                best = min(best, clock() - start)
            times.append(best)
    return times


class RowPadding:
    """Forward hooks on a head module: pad its input rows per `table`, cut its output back."""

    def __init__(self, head, table: list[int]) -> None:
        self.table, self.call = table, (0, ())  # call: the current forward's real rows and leading shape
        self.handles = [head.register_forward_pre_hook(self._pad), head.register_forward_hook(self._cut)]

    def _pad(self, _module, args):
        import torch

        hidden = args[0]
        m = hidden.numel() // hidden.shape[-1]
        target = self.table[m] if m < len(self.table) else m
        self.call = (m, hidden.shape[:-1])
        if target == m:
            return None
        flat = hidden.reshape(m, hidden.shape[-1])
        return (torch.cat([flat, flat.new_zeros(target - m, flat.shape[-1])]), *args[1:])

    def _cut(self, _module, _args, output):
        m, lead = self.call
        if output.shape[:-1] == lead:
            return None
        return output[:m].reshape(*lead, output.shape[-1])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
