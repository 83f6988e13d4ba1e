"""HFBackend on tiny-mistral (CPU): exact token counts, per-step stamps, greedy determinism, memory."""
import pytest

from batchlab.worker.backend import BackendError, OutOfMemory, BackendRequest, StepOutput
from batchlab.worker.hf.static import HFBackend, HFSettings, left_pad, special_prefix
from tests.conftest import scaled_tinyllama


def rows_of_mixed_lengths(batch_id: int = 0) -> list[BackendRequest]:
    prompts = [[100, 200, 300, 400, 500], list(range(1000, 1012)), [42]]
    outputs = [3, 6, 1]
    return [BackendRequest.new(10 + i, len(p), n, p, batch_id) for i, (p, n) in enumerate(zip(prompts, outputs))]


@pytest.fixture(scope="module")
def backend():
    b = HFBackend(HFSettings(model="tiny-mistral", device="cpu", max_batch_size=8))
    b.warmup()
    yield b
    b.close()


@pytest.fixture(scope="module")
def mixed_steps(backend) -> list[StepOutput]:
    """One run of the 3-row batch, shared by the tests that only read it."""
    return run(backend, rows_of_mixed_lengths())


def run(backend: HFBackend, rows: list[BackendRequest]) -> list[StepOutput]:
    steps: list[StepOutput] = []
    backend.run_batch(rows, steps.append)
    return steps


def tokens_by_row(steps: list[StepOutput]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for s in steps:
        for rid, tok in zip(s.request_ids, s.token_ids):
            out.setdefault(rid, []).append(tok)
    return out


def test_each_row_gets_exactly_its_output_len(mixed_steps):
    rows, steps = rows_of_mixed_lengths(), mixed_steps
    assert len(steps) == max(r.output_len for r in rows)
    assert {rid: len(t) for rid, t in tokens_by_row(steps).items()} == {r.request_id: r.output_len for r in rows}


def test_step_times_strictly_increase_and_chain(mixed_steps):
    steps = mixed_steps
    times = [s.time for s in steps]
    assert all(a < b for a, b in zip(times, times[1:]))
    assert all(s.start_time < s.time for s in steps)
    assert all(nxt.start_time == prev.time for prev, nxt in zip(steps, steps[1:]))


def test_finished_lists_each_row_once_at_its_last_token(mixed_steps):
    rows, steps = rows_of_mixed_lengths(), mixed_steps
    finished = [rid for s in steps for rid in s.finished]
    assert sorted(finished) == sorted(r.request_id for r in rows)
    for r in rows:
        step = steps[r.output_len - 1]
        assert r.request_id in step.finished and r.request_id in step.request_ids
        assert all(r.request_id not in s.request_ids for s in steps[r.output_len:])


def test_greedy_is_deterministic_and_padding_does_not_change_tokens(backend, mixed_steps):
    rows = rows_of_mixed_lengths()
    batched = tokens_by_row(mixed_steps)
    assert tokens_by_row(run(backend, rows)) == batched
    alone = tokens_by_row(run(backend, [rows[1]]))
    assert alone[rows[1].request_id] == batched[rows[1].request_id]


@pytest.mark.parametrize("form", ["linear", "transposed"])
def test_static_batches_give_the_same_tokens_with_the_lm_head_padded(backend, mixed_steps, monkeypatch, form):
    """generate() through the planned head (every count computed as 8 rows, in each form): the same tokens."""
    plan = backend.head_plan
    assert plan is not None and [len(t) for t in backend.info.facts["lm_head_ms"].values()] == [8, 8]
    monkeypatch.setattr(plan, "table", [("linear", 0)] + [(form, 8)] * 8)
    computed, forms = [], []
    head = backend.model.get_output_embeddings()
    hook = head.register_forward_pre_hook(
        lambda _m, args: computed.append(args[0].shape[0]) or forms.append(plan.call[2]))
    try:
        padded = run(backend, rows_of_mixed_lengths())
    finally:
        hook.remove()
    assert tokens_by_row(padded) == tokens_by_row(mixed_steps) and set(computed) == {8} and set(forms) == {form}


def test_info_reports_kv_geometry_and_cpu_budget(backend):
    info = backend.info
    assert info.kv_bytes_per_token == 2 * 8 * 4 * 64 * 4  # K and V, layers, kv heads, head dim, fp32
    assert (info.mode, info.device, info.memory_kind, info.max_batch_size) == ("static", "cpu", "cpu_peak_rss", 8)
    assert info.kv_budget_bytes > 0 and info.facts["n_params"] > 50e6 and info.facts["bos_prefix"] == [1]
    assert "warmup_s" in info.facts and backend.peak_memory_bytes() > 200e6


def test_strict_memory_refuses_big_batch_but_runs_single_row():
    b = HFBackend(HFSettings(model="tiny-mistral", device="cpu", memory_budget_bytes=16384 * 20,
                             strict_memory=True))
    rows = rows_of_mixed_lengths()[:2]  # 2 × (12 + 6) tokens × 16 KiB > 20 tokens' worth
    called: list[StepOutput] = []
    with pytest.raises(OutOfMemory):
        b.run_batch(rows, called.append)
    assert not called
    b.run_batch(rows[1:], called.append)  # over the estimate too, but a single row always runs
    assert len(called) == rows[1].output_len
    assert b.info.kv_budget_bytes == 16384 * 20


def test_continuous_mode_is_refused_clearly():
    from batchlab.protocol.settings import RunConfig

    with pytest.raises(BackendError, match="static"):
        HFBackend.from_config(RunConfig(backend="hf", strategy="continuous"), "continuous", 16)


def test_from_config_reads_run_settings():
    from batchlab.protocol.settings import RunConfig
    from batchlab.scheduler.strategies import resolve

    cfg = RunConfig(backend="hf", strategy="naive", batch_size=32, max_batch_size=4, memory_budget="1MiB",
                    device="cpu")
    b = HFBackend.from_config(cfg, "static", resolve(cfg).rows)
    assert (b.info.max_batch_size, b.info.kv_budget_bytes) == (32, 2**20)  # naive's rows: its batch size
    cfg = RunConfig(backend="hf", strategy="dynamic", batch_size=32, max_batch_size=4, device="cpu")
    assert HFBackend.from_config(cfg, "static", resolve(cfg).rows).info.max_batch_size == 4  # dynamic's: its cap
    cfg = RunConfig(backend="hf", strategy="dynamic", torch_compile=True, device="cpu")
    assert HFBackend.from_config(cfg, "static", resolve(cfg).rows).settings.torch_compile


def test_left_pad_and_bos_prefix():
    ids, mask = left_pad([[5, 6, 7], [9]], pad_id=0)
    assert ids == [[5, 6, 7], [0, 0, 9]] and mask == [[1, 1, 1], [0, 0, 1]]

    class NoSpecials:
        def encode(self, text, add_special_tokens=True):
            return [7]

    assert special_prefix(NoSpecials()) == []


@pytest.mark.slow  # compiles a decode step with inductor: of TinyLlama's architecture at 2 layers (the fewest)
def test_torch_compile_gives_the_same_tokens_from_one_shape_compiled_in_the_warmup():
    from torch._dynamo.utils import counters

    with scaled_tinyllama() as model:
        backend = HFBackend(HFSettings(model=model, device="cpu", max_batch_size=4))  # the same seeded weights
        before = counters["stats"]["unique_graphs"]
        compiled = HFBackend(HFSettings(model=model, device="cpu", max_batch_size=4, torch_compile=True))
    try:
        compiled.warmup()
        warm = counters["stats"]["unique_graphs"]
        batches = [rows_of_mixed_lengths(), rows_of_mixed_lengths()[1:2],
                   [BackendRequest.new(20, 30, 9, list(range(2000, 2030)), 2)]]
        for rows in batches:  # 3, 1 and 1 rows, prompts of 1 to 30 tokens: one padded shape
            assert tokens_by_row(run(compiled, rows)) == tokens_by_row(run(backend, rows))
        assert warm > before and counters["stats"]["unique_graphs"] == warm  # no recompile after the warm-up
        assert compiled.info.facts["decode"].endswith("torch.compile")
    finally:
        compiled.close()
        backend.close()


def test_torch_compile_is_refused_for_the_continuous_loop():
    from batchlab.worker.hf.continuous import HFContinuousBackend

    with pytest.raises(BackendError, match="--torch-compile applies to static hf batches"):
        HFContinuousBackend(HFSettings(model="tiny-mistral", device="cpu", torch_compile=True))
