"""Calibration's measuring half: real step times of a warm backend over a grid of batch sizes and
prompt lengths, each shape repeated until its spread settles (worker.calibrate.settle).

Static backends (HF generate()) run a lockstep batch: the prefill is timed from the run_batch call to
the first token (what the simulator counts from a batch's launch), decode steps as the gaps between
step ends. Continuous backends (the HF loop, vLLM) get every row admitted at once and are stepped; the
prefill is the steps until every row has its first token. Decode steps skip the first one after the
prefill (its cache still grows) and report their median.
"""
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from batchlab.protocol.clock import now
from batchlab.worker.backend import Row, StepOutput
from batchlab.worker.calibrate import Sample, settle

SKIP_DECODE_STEPS = 1


@dataclass(slots=True)
class Grid:
    """Shapes to measure: every rows × prompt_len with rows × prompt_len ≤ max_tokens."""

    rows: list[int]
    prompt_lens: list[int]
    steps: int = 8  # tokens per run: 1 prefill + decode steps
    max_tokens: int = 2048
    min_rounds: int = 3
    max_rounds: int = 7

    def shapes(self) -> list[tuple[int, int]]:
        """(rows, prompt_len) in measuring order."""
        return [(b, p) for p in self.prompt_lens for b in self.rows if b * p <= self.max_tokens]


QUICK = Grid([1, 2, 4, 8], [16, 64, 192], steps=8, max_tokens=1536, min_rounds=3, max_rounds=5)
FULL = Grid([1, 2, 4, 8, 16, 32], [16, 64, 256, 512], steps=12, max_tokens=4096, min_rounds=3, max_rounds=9)


def _rows(rows: int, prompt_len: int, steps: int, rng: random.Random, first_id: int) -> list[Row]:
    return [Row(first_id + i, prompt_len, steps, [rng.randrange(100, 32000) for _ in range(prompt_len)], 0)
            for i in range(rows)]


def static_round(backend, rows: list[Row]) -> dict[str, float]:
    """One lockstep batch: {"prefill": launch → first token, "decode": median gap between later steps}."""
    outs: list[StepOutput] = []
    start = now()
    backend.run_batch(rows, outs.append)
    ends = [o.time for o in outs]
    gaps = [b - a for a, b in zip(ends[1 + SKIP_DECODE_STEPS - 1:], ends[1 + SKIP_DECODE_STEPS:])]
    return {"prefill": ends[0] - start, "decode": statistics.median(gaps)}


def stepping_round(backend, rows: list[Row]) -> dict[str, float]:
    """Every row admitted at once, then stepped: prefill = admit → every row's first token."""
    start = now()
    backend.admit(rows)
    ends, joined, prefill_s = [], 0, 0.0
    while backend.has_work():
        out = backend.step()
        if out is None:
            continue
        joined += out.joined
        if not prefill_s and joined >= len(rows):
            prefill_s = out.time - start
        elif prefill_s:
            ends.append(out.time)
    gaps = [b - a for a, b in zip(ends[SKIP_DECODE_STEPS - 1:], ends[SKIP_DECODE_STEPS:])] if len(ends) > 1 else []
    return {"prefill": prefill_s, "decode": statistics.median(gaps) if gaps else float("nan")}


def measure_shape(backend, rows: int, prompt_len: int, grid: Grid, rng: random.Random, stepping: bool) -> list[Sample]:
    """A shape warmed once, then repeated until settled: its prefill and decode samples."""
    ids = iter(range(10**6, 10**9, 1000))
    one_round = stepping_round if stepping else static_round
    run = lambda: one_round(backend, _rows(rows, prompt_len, grid.steps, rng, next(ids)))  # noqa: E731
    run()  # warm this shape (kernels, allocator blocks)
    result = settle(run, grid.min_rounds, grid.max_rounds)
    measured = range(1 + SKIP_DECODE_STEPS, grid.steps)  # decode steps whose gaps were timed
    context = rows * statistics.fmean(prompt_len + i for i in measured)  # equal rows: padded = packed
    return [Sample(kind, rows, prompt_len, rows * prompt_len if kind == "prefill" else context,
                   r.value, r.spread, r.rounds, r.settled) for kind, r in result.items()]


def measure_grid(backend, grid: Grid, stepping: bool, on_shape: Callable[[list[Sample]], None] | None = None,
                 seed: int = 0) -> list[Sample]:
    """Every shape of the grid on a warm backend."""
    rng, samples = random.Random(seed), []
    for rows, prompt_len in grid.shapes():
        shape = measure_shape(backend, rows, prompt_len, grid, rng, stepping)
        samples += shape
        if on_shape is not None:
            on_shape(shape)
    return samples
