"""HFContinuousBackend on tiny-mistral (CPU): exact lengths, join/leave at step boundaries, solo-equal
greedy tokens (prompts whole or in chunks), the per-step token budget, KV-budget waits and OOM requeues that
lose no row, on the slot layout (the default) and the padded one; the chunk plan and PaddedKV bookkeeping on
toy data (SlotKV's is in test_hf_slots.py)."""
import pytest
import torch

from batchlab.protocol.clock import now
from batchlab.worker.backend import BackendError, BackendRequest, StepOutput
from batchlab.worker.hf.chunks import DEFAULT_BATCHED_TOKENS, plan_chunks, step_budget
from batchlab.worker.hf.continuous import HFContinuousBackend
from batchlab.worker.hf.layouts import PaddedKV
from batchlab.worker.hf.static import HFSettings


def mixed_rows() -> list[BackendRequest]:
    prompts = [list(range(300, 330)), [7, 8, 9, 10, 11, 12, 13], list(range(900, 950)), [42, 43, 44],
               list(range(5000, 5020))]
    outputs = [12, 5, 9, 1, 15]
    return [BackendRequest.new(i, len(p), n, p, i) for i, (p, n) in enumerate(zip(prompts, outputs))]


@pytest.fixture(scope="module")
def backend():
    b = HFContinuousBackend(HFSettings(model="tiny-mistral", device="cpu", max_batch_size=8))
    b.warmup()
    yield b
    b.close()


def drive(b: HFContinuousBackend,
          arrivals: list[list[BackendRequest]]) -> tuple[dict[int, list[int]], list[StepOutput]]:
    """Admit arrivals[k] before step k, then step until idle: (tokens by request, steps)."""
    tokens: dict[int, list[int]] = {}
    outs: list[StepOutput] = []
    k = 0
    while k < len(arrivals) or b.has_work():
        if k < len(arrivals):
            b.admit(arrivals[k])
            k += 1
        out = b.step()
        if out is not None:
            outs.append(out)
            for rid, tok in zip(out.request_ids, out.token_ids):
                tokens.setdefault(rid, []).append(tok)
    return tokens, outs


@pytest.fixture(scope="module")
def solo(backend):
    """Each row run alone."""
    return {r.request_id: drive(backend, [[r]])[0][r.request_id] for r in mixed_rows()}


BUSY_ARRIVALS = [[0], [], [1, 2], [3], [], [4]]  # row indices admitted before steps 0..5


def busy_run(b):
    rows = mixed_rows()
    return drive(b, [[rows[i] for i in group] for group in BUSY_ARRIVALS])


@pytest.mark.slow  # tiny-mistral on HF
@pytest.mark.parametrize("fuse", [True, False])
def test_greedy_tokens_are_the_same_alone_or_joining_a_busy_batch(backend, solo, monkeypatch, fuse):
    monkeypatch.setattr(backend, "fuse", fuse)
    tokens, _ = busy_run(backend)
    assert tokens == solo


@pytest.mark.slow  # tiny-mistral on HF
@pytest.mark.parametrize("fuse, form", [(True, "linear"), (False, "linear"), (True, "transposed")])
def test_a_padded_lm_head_leaves_the_greedy_tokens_as_they_are(backend, solo, monkeypatch, fuse, form):
    """Every row count computed as 8 rows (zero rows appended, their logits dropped), in each form: the same
    tokens."""
    plan = backend.base.head_plan
    assert plan is not None and "lm_head_ms" in backend.info.facts  # the warm-up timed the head
    monkeypatch.setattr(plan, "table", [("linear", 0)] + [(form, 8)] * 8)
    monkeypatch.setattr(backend, "fuse", fuse)
    computed, forms = [], []
    hook = backend.model.get_output_embeddings().register_forward_pre_hook(
        lambda _m, args: computed.append(args[0].shape[0]) or forms.append(plan.call[2]))  # after the plan's pad
    try:
        tokens, _ = busy_run(backend)
    finally:
        hook.remove()
    assert tokens == solo and set(computed) == {8} and set(forms) == {form}


@pytest.mark.slow  # tiny-mistral on HF
def test_solo_tokens_equal_static_generate(backend, solo):
    row = mixed_rows()[0]
    outs: list[StepOutput] = []
    backend.base.run_batch([row], outs.append)
    assert [o.token_ids[0] for o in outs] == solo[row.request_id]


@pytest.mark.slow  # tiny-mistral on HF
def test_every_row_gets_exactly_its_output_len(backend):
    tokens, outs = busy_run(backend)
    assert {rid: len(t) for rid, t in tokens.items()} == {r.request_id: r.output_len for r in mixed_rows()}
    finished = [rid for o in outs for rid in o.finished]
    assert sorted(finished) == [0, 1, 2, 3, 4] and not any(o.failed for o in outs)


@pytest.mark.slow  # tiny-mistral on HF
def test_rows_join_at_the_next_step_and_leave_when_done(backend):
    _, outs = busy_run(backend)
    assert [o.joined for o in outs[:6]] == [1, 0, 2, 1, 0, 1]
    assert outs[2].running == 3 and set(outs[2].request_ids) == {0, 1, 2}  # 1, 2 get their first token at once
    assert outs[3].finished == [3]  # output_len 1: its prefill token is its last
    assert 0 not in outs[12].request_ids and outs[11].finished == [0]  # 12 tokens: steps 0..11
    assert all(o.running == len(o.request_ids) for o in outs)
    assert all(o.start_time <= o.time for o in outs) and all(a.time <= b.start_time for a, b in zip(outs, outs[1:]))


@pytest.mark.slow  # tiny-mistral on HF
def test_a_short_request_finishes_while_a_long_one_runs(backend):
    long, short = BackendRequest.new(0, 10, 40, list(range(10, 20)), 0), BackendRequest.new(1, 4, 3, [5, 6, 7, 8], 1)
    tokens, outs = drive(backend, [[long], [], [short]])
    done_step = {rid: i for i, o in enumerate(outs) for rid in o.finished}
    assert done_step[1] == 4 < done_step[0] == 39 and len(tokens[0]) == 40


@pytest.mark.slow  # tiny-mistral on HF
def test_a_small_kv_budget_makes_joiners_wait_and_loses_none(backend, solo):
    saved = backend.info.kv_budget_bytes
    backend.info.kv_budget_bytes = 70 * backend.info.kv_bytes_per_token  # about one row at a time
    waited = backend.run_facts()["row_steps_waiting"]
    try:
        tokens, outs = busy_run(backend)
    finally:
        backend.info.kv_budget_bytes = saved
    assert tokens == solo
    assert max(o.running for o in outs) <= 2 and backend.run_facts()["row_steps_waiting"] > waited


@pytest.mark.slow  # tiny-mistral on HF
def test_an_oom_in_decode_requeues_the_rows_and_they_resume(backend, solo, monkeypatch):
    model, calls, preempted = backend.model, {"n": 0}, backend.run_facts()["preempted_rows"]

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5 and kwargs["input_ids"].shape[0] > 1:
            raise torch.OutOfMemoryError("simulated")
        return model(*args, **kwargs)

    monkeypatch.setattr(backend, "model", flaky)
    tokens, outs = busy_run(backend)
    halved, backend.max_rows = backend.max_rows, 8
    assert backend.run_facts()["preempted_rows"] - preempted == 3 and halved == 1
    assert tokens == solo and not any(o.failed for o in outs)


@pytest.mark.slow  # tiny-mistral on HF
def test_a_row_that_cannot_prefill_alone_fails_with_a_reason(backend, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("simulated")

    monkeypatch.setattr(backend, "model", oom)
    backend.admit([mixed_rows()[0]])
    out = backend.step()
    assert out.failed == [(0, "out of memory: the prompt does not fit alone")] and not backend.has_work()


def token_times(out: StepOutput) -> dict[int, float]:
    """Each request's token time in one step (a continuous step yields one token per row)."""
    return dict(zip(out.request_ids, out.times or [out.time] * len(out.request_ids)))


@pytest.mark.slow  # tiny-mistral on HF
@pytest.mark.parametrize("fuse", [True, False])
def test_each_token_is_stamped_when_the_forward_that_made_it_ends(backend, monkeypatch, fuse):
    """Fused (the default): the running row's decode and the joiners' last chunks are one forward, so all three
    tokens exist when it ends; not fused: the running row's token exists before the joiners' prefill starts."""
    model, prefills = backend.model, []
    monkeypatch.setattr(backend, "fuse", fuse)

    def timed(*args, **kwargs):
        if kwargs["input_ids"].shape[1] == 1:  # a decode [R, 1]
            return model(*args, **kwargs)
        started = now()
        logits = model(*args, **kwargs)
        prefills.append((started, now()))
        return logits

    monkeypatch.setattr(backend, "model", timed)
    rows = mixed_rows()
    _, outs = drive(backend, [[rows[0]], [], [rows[1], rows[2]]])
    started, ended = prefills[1]  # rows 1 and 2 join at step 2, while row 0 runs
    times = token_times(outs[2])
    if fuse:
        assert len(prefills) == 2 and started <= ended <= times[0] == times[1] == times[2] <= outs[2].time
    else:
        assert times[0] <= started and ended <= times[1] == times[2] <= outs[2].time
    assert all(o.start_time <= t <= o.time for o in outs for t in token_times(o).values())


@pytest.mark.slow  # tiny-mistral on HF
def test_eos_is_banned_even_where_it_is_the_models_top_choice(backend, solo):
    eos, row, tops, seconds = backend.model.generation_config.eos_token_id, mixed_rows()[0], [], []

    def eos_on_top(module, args, logits):  # lm_head's output [N, S, V]: EOS beats every other id
        boosted = logits.clone()
        boosted[..., eos] = logits.max(-1).values + 10.0
        top2 = boosted[:, -1].topk(2).indices  # [N, 2]
        tops.extend(top2[:, 0].tolist())
        seconds.extend(top2[:, 1].tolist())
        return boosted

    handle = backend.model.lm_head.register_forward_hook(eos_on_top)
    try:
        alone = drive(backend, [[row]])[0][row.request_id]  # one row per forward: a token per call
        alone_seconds, busy = list(seconds), busy_run(backend)[0]
        static: list[StepOutput] = []
        backend.base.run_batch([row], static.append)
    finally:
        handle.remove()
    assert set(tops) == {eos} and eos not in alone
    assert alone == alone_seconds == solo[row.request_id] and busy == solo
    assert [o.token_ids[0] for o in static] == alone


def test_factory_routes_hf_continuous_here_and_static_elsewhere(monkeypatch):
    from batchlab.protocol.settings import RunConfig
    from batchlab.worker import factory

    built = []
    monkeypatch.setattr(HFContinuousBackend, "__init__", lambda self, s, **kw: built.append((s, kw)))
    b = factory.make_backend(RunConfig(backend="hf", strategy="continuous", max_batch_size=5, device="cpu",
                                       max_num_batched_tokens=64), "continuous", 5)
    assert isinstance(b, HFContinuousBackend) and built[0][0].max_batch_size >= 5
    assert built[0][1] == {"max_num_batched_tokens": 64}
    with pytest.raises(BackendError, match="continuous"):
        HFContinuousBackend.from_config(RunConfig(backend="hf"), "static", 16)


class _Layer:
    def __init__(self, keys: torch.Tensor) -> None:
        self.keys, self.values = keys, keys.clone()


class _Cache:
    def __init__(self, keys: torch.Tensor) -> None:
        self.layers = [_Layer(keys)]

    def get_seq_length(self) -> int:
        return self.layers[0].keys.shape[-2]


def toy_kv(cols: list[list[float]], pad: list[int]) -> PaddedKV:
    kv = PaddedKV(torch, torch.device("cpu"))
    kv.cache, kv.pad = _Cache(torch.tensor(cols)[:, None, :, None]), pad  # [B, 1, T, 1]
    return kv


def test_padded_kv_merge_left_pads_the_narrower_and_select_cuts_shared_padding():
    kv = toy_kv([[0, 1, 2], [0, 0, 3]], [1, 2])
    kv.merge(toy_kv([[7, 8, 9, 6, 5]], [0]))
    assert kv.pad == [3, 4, 0] and kv.cache.layers[0].keys[:, 0, :, 0].tolist() == [
        [0, 0, 0, 1, 2], [0, 0, 0, 0, 3], [7, 8, 9, 6, 5]]
    assert kv.mask(1).tolist()[1] == [0, 0, 0, 0, 1, 1] and kv.positions().tolist() == [[2], [1], [5]]
    kv.select([1, 0])
    assert kv.pad == [1, 0] and kv.cache.layers[0].keys[:, 0, :, 0].tolist() == [[0, 3], [1, 2]]
    kv.select([])
    assert kv.cache is None and kv.width() == 0


@pytest.fixture(scope="module")
def padded():
    b = HFContinuousBackend(HFSettings(model="tiny-mistral", device="cpu", max_batch_size=8), layout="padded")
    b.warmup()
    yield b
    b.close()


@pytest.mark.slow  # tiny-mistral on HF
def test_the_padded_layout_gives_the_same_tokens_as_the_slot_layout(padded, solo):
    tokens, outs = busy_run(padded)
    assert tokens == solo and [o.joined for o in outs[:6]] == [1, 0, 2, 1, 0, 1]


@pytest.mark.slow  # tiny-mistral on HF
def test_slot_decode_steps_write_in_place_without_growing_the_cache(backend):
    backend.admit([BackendRequest.new(0, 10, 20, list(range(10, 20)), 0),
                   BackendRequest.new(1, 4, 20, [5, 6, 7, 8], 1)])
    backend.step()
    slots = backend.kv  # the slot layout is the SlotKV
    storage, shape = slots.keys[0].data_ptr(), slots.keys[0].shape
    for _ in range(18):
        backend.step()
    assert slots.keys[0].data_ptr() == storage and slots.keys[0].shape == shape
    assert slots.col_h == [29, 23]  # prompt columns (BOS + 10, BOS + 4; no padding in the cache) + 18 decoded
    backend.step()
    assert not backend.has_work() and slots.rows == 0


@pytest.mark.slow  # tiny-mistral on HF
def test_a_sliding_window_model_runs_rows_inside_its_window_and_refuses_longer_ones(tmp_path, solo):
    import json
    import shutil

    from batchlab.models.folders import resolve_model

    folder = tmp_path / "tiny-mistral-window"
    shutil.copytree(resolve_model("tiny-mistral"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 48}))  # as Mistral-7B's 4096
    b = HFContinuousBackend(HFSettings(model=str(folder), device="cpu", max_batch_size=8))
    try:
        b.warmup()
        inside, outside = mixed_rows()[0], mixed_rows()[2]  # 1 + 30 + 12 ≤ 48 < 1 + 50 + 9 (BOS counted)
        tokens, outs = drive(b, [[inside, outside]])
    finally:
        b.close()
    failed = {rid: why for o in outs for rid, why in o.failed}
    assert tokens[inside.request_id] == solo[inside.request_id]  # inside the window: the same model
    assert list(failed) == [outside.request_id] and "sliding window (48 tokens)" in failed[outside.request_id]
    assert outside.request_id not in tokens


# --- chunked prefill -------------------------------------------------------------------------------------
def test_a_steps_budget_goes_to_the_oldest_prompts_first_the_next_one_in_part():
    assert plan_chunks(16, [40, 5]) == [16]
    assert plan_chunks(16, [10, 40, 3]) == [10, 6]
    assert plan_chunks(0, [10]) == [] and plan_chunks(None, [300, 7]) == [300, 7]


def test_the_budget_defaults_when_unset_and_a_budget_below_the_row_cap_is_refused():
    assert step_budget(0, 8) == DEFAULT_BATCHED_TOKENS["cpu"] and step_budget(0, 10_000) == 10_000
    assert step_budget(0, 8, "cuda") == DEFAULT_BATCHED_TOKENS["cuda"]
    assert step_budget(16, 8) == 16
    with pytest.raises(BackendError, match="below the row cap 32"):
        step_budget(16, 32)


@pytest.fixture
def budget16(backend):
    saved, backend.budget = backend.budget, 16
    yield backend
    backend.budget = saved


@pytest.mark.slow  # tiny-mistral on HF
@pytest.mark.parametrize("fuse", [True, False])
def test_chunked_prefill_gives_the_same_tokens_as_a_solo_run(budget16, solo, monkeypatch, fuse):
    monkeypatch.setattr(budget16, "fuse", fuse)
    tokens, outs = busy_run(budget16)  # prompts of up to 51 tokens (BOS included) in chunks of ≤ 16
    assert tokens == solo
    assert {rid: len(t) for rid, t in tokens.items()} == {r.request_id: r.output_len for r in mixed_rows()}
    assert max(o.prefill_tokens for o in outs) <= 16 and sum(o.prefill_tokens for o in outs) == sum(
        1 + len(r.prompt_tokens) for r in mixed_rows())
    assert all(o.prefill_width <= o.prefill_tokens <= o.prefill_rows * o.prefill_width for o in outs)
    assert any(o.prefill_rows >= 2 for o in outs)  # several rows' chunks in one step: its width the longest


@pytest.mark.slow  # tiny-mistral on HF
def test_a_long_prompt_joins_over_several_steps_while_the_running_row_gets_a_token_each_step(budget16, solo):
    short, long = mixed_rows()[0], mixed_rows()[2]  # 31 and 51 prompt tokens (BOS included)
    tokens, outs = drive(budget16, [[short], [], [long]])
    assert tokens[long.request_id] == solo[long.request_id] and tokens[short.request_id] == solo[short.request_id]
    first = next(i for i, o in enumerate(outs) if long.request_id in o.request_ids)
    assert first == 2 + 3  # 51 tokens at 15 a step (one decode each): steps 2, 3, 4 and its last chunk at 5
    assert [o.prefill_tokens for o in outs[2:6]] == [15, 15, 15, 6] and outs[first].joined == 1
    assert [(o.prefill_rows, o.prefill_width, o.prefill_pairs) for o in outs[2:6]] == [  # a chunk attends over
        (1, 15, 15 ** 2), (1, 15, 30 ** 2 - 15 ** 2), (1, 15, 45 ** 2 - 30 ** 2),  # its row's earlier ones
        (1, 6, 51 ** 2 - 45 ** 2)]
    assert all(short.request_id in o.request_ids for o in outs[1:first + 1])  # never stalled a whole prompt
    assert all(len(o.request_ids) - o.joined + o.prefill_tokens <= 16 for o in outs)


@pytest.mark.slow  # tiny-mistral on HF
def test_an_oom_in_a_later_chunk_requeues_the_row_and_it_prefills_again_from_the_start(budget16, solo,
                                                                                      monkeypatch):
    model, chunks, requeued = budget16.model, [], budget16.run_facts()["oom_requeues"]

    def flaky(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:  # a prefill forward
            chunks.append(kwargs["input_ids"].shape[1])
            if len(chunks) == 4:  # the long row's second chunk (after the short row's two)
                raise torch.OutOfMemoryError("simulated")
        return model(*args, **kwargs)

    monkeypatch.setattr(budget16, "model", flaky)
    short, long = mixed_rows()[0], mixed_rows()[2]
    tokens, outs = drive(budget16, [[short], [], [long]])
    budget16.max_rows = 8
    assert budget16.run_facts()["oom_requeues"] - requeued == 1 and not any(o.failed for o in outs)
    assert tokens == {r.request_id: solo[r.request_id] for r in (short, long)}

