"""What the `hf` backend hands `model.generate()`: a streamer that turns each decode step into a StepOutput,
and the --torch-compile arguments (a static cache over fixed shapes)."""
from collections.abc import Callable

from batchlab.protocol.clock import now
from batchlab.worker.backend import Row, StepOutput, lockstep_output

COMPILE_COLUMN_BLOCK = 512  # --torch-compile: the static cache's columns, in blocks (a new block recompiles)


class StepStreamer:
    """A generate() streamer that turns each decode step's tokens into one StepOutput."""

    def __init__(self, rows: list[Row], on_step: Callable[[StepOutput], None], sync: Callable[[], None]) -> None:
        self.rows, self.on_step, self.sync = rows, on_step, sync
        self.step = -1  # -1: the next put() carries the prompt ids [B, S]
        self.last_time = now()

    def put(self, value) -> None:
        """value: prompt ids [B, S] on the first call, then the step's new tokens [B] (on the host)."""
        if self.step < 0:
            self.step, self.last_time = 0, now()
            return
        self.sync()
        t, tokens = now(), value.reshape(-1).tolist()
        self.on_step(lockstep_output(self.rows, self.step, lambda i, _r: tokens[i], t, self.last_time))
        self.step, self.last_time = self.step + 1, t

    def end(self) -> None:
        """Nothing buffered."""


def compile_kwargs(columns: int, device) -> dict:
    """--torch-compile: generate() with a static KV cache of COMPILE_COLUMN_BLOCK-rounded columns (it only
    grows, so a longer batch recompiles at most once per block) over batches padded to the row cap, so every
    decode step has one shape; transformers compiles that step (mode reduce-overhead, i.e. CUDA graphs, on
    CUDA; inductor's default on CPU, where it is for checking the path: it does not pay there)."""
    from transformers import CompileConfig

    cuda = device.type == "cuda"
    config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if cuda else "default")
    config._compile_all_devices = not cuda  # transformers compiles on CUDA by itself; on CPU only when asked
    block = COMPILE_COLUMN_BLOCK
    return {"cache_implementation": "static", "compile_config": config,
            "max_cache_len": -(-columns // block) * block}
