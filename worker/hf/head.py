"""The LM head at the row count and in the form it runs fastest.

A decode step's largest matrix product is the LM head: [rows, hidden] × [hidden, vocab]. How long it takes
depends on the rows and on how the product is put to the BLAS, not monotonically: `linear` (x · Wᵀ, what
nn.Linear calls) against `transposed` ((W · xᵀ)ᵀ, the same numbers); docs/workers.md gives the timings
that made this worth doing (on a CPU, `linear`'s kernel for 2 or 3 rows reads the weights once per row).

So at warm-up the head is timed in both forms for every row count up to the worker's row cap (`head_times`,
fastest of a few repeats), and a forward with m rows runs the form and the count m' ≥ m (zero rows appended,
their logits dropped) that was fastest (`plan_table`; a plan other than `linear` at m is taken only if it
gains at least 1 − MIN_GAIN, so noise does not move a count). Hooks on the model's own head module do it, so
`generate()` (static batches) and the continuous loop both get it and the weights stay tied. The real rows'
logits are the same products; only the kernel's summation order may differ, as it already does between
batch sizes (greedy tokens unchanged: tests/test_hf_backend.py, tests/test_hf_continuous.py).
"""
from collections.abc import Callable

MIN_GAIN = 0.9  # another plan than (linear, m) is taken only if it is at least 10% faster
TIMING_REPEATS = 3
MAX_TIMED_ROWS = 64  # counts above run as they are (a big head on a CPU takes ~0.1 s a call to time)
FORMS = ("linear", "transposed")


def product(form: str, x, weight, bias=None):
    """x [m, hidden] × weightᵀ (+ bias) → [m, vocab], computed as `form` says."""
    import torch

    out = torch.nn.functional.linear(x, weight) if form == "linear" else (weight @ x.t()).t()
    return out if bias is None else out + bias


def plan_table(times_s: dict[str, list[float]]) -> list[tuple[str, int]]:
    """times_s[form][m - 1]: the head's time for m rows in that form → table[m]: (form, rows) to compute
    for m rows (table[0] = ("linear", 0))."""
    n = len(times_s["linear"])
    table = [("linear", 0)]
    for m in range(1, n + 1):
        best = min(((f, k) for f in times_s for k in range(m, n + 1)), key=lambda p: times_s[p[0]][p[1] - 1])
        gain = times_s[best[0]][best[1] - 1] <= MIN_GAIN * times_s["linear"][m - 1]
        table.append(best if gain else ("linear", m))
    return table


def head_times(head, rows: int, hidden: int, device, dtype, sync: Callable[[], None], clock,
               form: str = "linear") -> list[float]:
    """The head's time in `form` for 1..rows rows of zeros (fastest of TIMING_REPEATS, after one untimed call)."""
    import torch

    times = []
    with torch.inference_mode():
        for m in range(1, rows + 1):
            x = torch.zeros(m, hidden, device=device, dtype=dtype)
            product(form, x, head.weight, head.bias)
            best = float("inf")
            for _ in range(TIMING_REPEATS):
                sync()
                start = clock()
                product(form, x, head.weight, head.bias)
                sync()
                best = min(best, clock() - start)
            times.append(best)
    return times


class HeadPlan:
    """A head module computing each row count as `table` says: a forward pre-hook pads the rows, its forward
    runs the planned form, a forward hook cuts the output back to the real rows."""

    def __init__(self, head, table: list[tuple[str, int]]) -> None:
        self.head, self.table = head, table
        self.call = (0, (), "linear")  # the current forward's real rows, leading shape and form
        self.handles = [head.register_forward_pre_hook(self._pad), head.register_forward_hook(self._cut)]
        head.forward = self._forward  # an instance attribute: nn.Linear.forward stays as it is for others

    def _pad(self, _module, args):
        import torch

        hidden = args[0]
        m = hidden.numel() // hidden.shape[-1]
        form, target = self.table[m] if m < len(self.table) else ("linear", m)
        self.call = (m, hidden.shape[:-1], form)
        if target == m:
            return None
        flat = hidden.reshape(m, hidden.shape[-1])
        return (torch.cat([flat, flat.new_zeros(target - m, flat.shape[-1])]), *args[1:])

    def _forward(self, x):
        form = self.call[2]
        if form == "linear":
            return self.head.__class__.forward(self.head, x)
        return product(form, x.reshape(-1, x.shape[-1]), self.head.weight, self.head.bias)

    def _cut(self, _module, _args, output):
        m, lead, form = self.call
        if output.shape[:-1] == lead:
            return None
        real = output[:m] if form == "linear" else output[:m].contiguous()  # rows in place: argmax reads them
        return real.reshape(*lead, output.shape[-1])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        del self.head.forward
