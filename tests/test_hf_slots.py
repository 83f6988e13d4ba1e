"""SlotKV bookkeeping on toy tensors (prefill into free slots, in chunks, in-place decode writes, per-row
masks and positions, freeing a slot by moving the last running row and the prefilling rows behind it,
growth) and the grouped-query decode attention."""
import torch

from batchlab.worker.hf.slots import COLUMN_BLOCK, SlotKV, slot_attention


def toy_slots(rows: int = 4) -> SlotKV:
    kv = SlotKV(torch, torch.device("cpu"), torch.float32, layers=1, kv_heads=1, head_dim=1)
    kv.reserve(rows, 8, rows)
    return kv


def prefill(kv: SlotKV, chunks: list[list[int]], marks: list[float], done: int) -> dict:
    """Run chunks of the oldest prefilling rows; input p of row j carries K = V = 10 × marks[j] + p (so a
    test sees which column each input went to); the oldest `done` rows then run, first tokens 100 + j."""
    inputs = kv.prefill_inputs(chunks, pad_id=0)
    width = inputs["input_ids"].shape[1]
    states = torch.tensor([[10.0 * m + p for p in range(width)] for m in marks]).view(len(chunks), 1, width, 1)
    kv.update(states, states.clone(), 0)
    kv.prefilled(torch.tensor([100 + j for j in range(done)]), done)
    return inputs


def cached(kv: SlotKV, slots: int, columns: int) -> list[list[float]]:
    return kv.keys[0][:slots, 0, :columns, 0].tolist()


def test_a_prefill_writes_joiners_into_the_next_free_slots_at_their_own_columns():
    kv = toy_slots()
    kv.add(2)
    inputs = prefill(kv, [[5, 6, 7], [8, 9]], [1, 2], done=2)
    assert inputs["input_ids"].tolist() == [[5, 6, 7], [0, 8, 9]]  # left-padded
    assert inputs["position_ids"].tolist() == [[0, 1, 2], [2, 0, 1]]  # the padding input goes past the row
    assert inputs["attention_mask"][1, 0].tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    kv.add(1)
    prefill(kv, [[4, 4]], [3], done=1)
    assert kv.rows == 3 and kv.prefilling == 0 and kv.col_h == [3, 2, 2]
    assert cached(kv, 3, 3) == [[10, 11, 12], [21, 22, 20], [30, 31, 0]]  # row 1's column 2: padding, free


def test_a_chunked_prompt_fills_its_slot_over_steps_and_attends_over_its_earlier_chunks():
    kv = toy_slots()
    kv.add(1)
    prefill(kv, [[1, 2, 3]], [1], done=0)
    assert kv.rows == 0 and kv.fill_h == [3]
    inputs = prefill(kv, [[4, 5]], [2], done=1)
    assert inputs["position_ids"].tolist() == [[3, 4]]
    assert inputs["attention_mask"][0, 0].tolist() == [[True] * 4 + [False], [True] * 5]
    assert kv.col_h == [5] and kv.fill_h == [] and cached(kv, 1, 5) == [[10, 11, 12, 20, 21]]
    assert kv.decode_inputs()["position_ids"].tolist() == [[5]]


def test_a_partly_filled_row_and_a_fresh_one_share_a_prefill_forward():
    kv = toy_slots()
    kv.add(1)
    prefill(kv, [[1, 2, 3]], [1], done=0)
    kv.add(1)
    inputs = prefill(kv, [[4, 5], [6, 7, 8]], [2, 3], done=1)
    assert inputs["position_ids"].tolist() == [[5, 3, 4], [0, 1, 2]]
    assert inputs["attention_mask"].shape == (2, 1, 3, 6)  # columns: up to the partly filled row's chunk
    assert kv.col_h == [5] and kv.fill_h == [3] and kv.tokens.tolist()[0] == 100
    assert cached(kv, 2, 6) == [[10, 11, 12, 21, 22, 20], [30, 31, 32, 0, 0, 0]]


def test_a_decode_step_writes_each_row_in_place_at_its_own_column_and_masks_by_length():
    kv = toy_slots()
    kv.add(2)
    prefill(kv, [[5, 6, 7], [8, 9]], [1, 2], done=2)
    kv.add(1)
    prefill(kv, [[4, 4]], [3], done=1)
    storage = kv.keys[0].data_ptr()
    inputs = kv.decode_inputs()
    assert inputs["input_ids"].tolist() == [[100], [101], [100]]
    assert inputs["position_ids"].tolist() == [[3], [2], [2]]
    assert inputs["attention_mask"][:, 0, 0].tolist() == [[True] * 4, [True, True, True, False],
                                                         [True, True, True, False]]
    keys, _ = kv.update(torch.tensor([7.0, 8.0, 9.0]).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1), 0)
    assert keys.shape == (3, 1, 4, 1) and keys[:, 0, :, 0].tolist() == [[10, 11, 12, 7], [21, 22, 8, 0],
                                                                         [30, 31, 9, 0]]
    kv.decoded(torch.tensor([11, 12, 13]))
    assert kv.col_h == [4, 3, 3] and kv.col.tolist()[:3] == [4, 3, 3] and kv.keys[0].data_ptr() == storage
    assert kv.decode_inputs()["input_ids"].tolist() == [[11], [12], [13]]


def test_a_finished_row_frees_its_slot_and_the_last_row_moves_in():
    kv = toy_slots()
    kv.add(3)
    prefill(kv, [[1], [2], [3]], [1, 2, 3], done=3)
    kv.add(1)
    prefill(kv, [[9, 9]], [4], done=1)
    order = kv.release([0, 2])
    assert order == [3, 1] and kv.rows == 2 and kv.col_h == [2, 1]
    assert cached(kv, 2, 2) == [[40, 41], [20, 0]] and kv.tokens.tolist()[:2] == [100, 101]
    assert kv.release([1]) == [0] and kv.release([0]) == [] and kv.rows == 0


def test_the_prefilling_rows_move_down_behind_the_running_ones():
    kv = toy_slots()
    kv.add(3)
    prefill(kv, [[1], [2], [3]], [1, 2, 3], done=3)
    kv.add(1)
    prefill(kv, [[7, 8]], [4], done=0)  # slot 3, two columns filled
    assert kv.release([0]) == [2, 1] and kv.rows == 2 and kv.fill_h == [2]
    assert cached(kv, 3, 2) == [[30, 0], [20, 0], [40, 41]]
    prefill(kv, [[9]], [5], done=1)  # its last chunk: it runs from slot 2
    assert kv.col_h == [1, 1, 3] and cached(kv, 3, 3)[2] == [40, 41, 50]


def test_growing_the_cache_keeps_the_running_and_the_prefilling_rows():
    kv = toy_slots(rows=2)
    kv.add(2)
    prefill(kv, [[1, 2], [3]], [5, 6], done=1)
    kv.reserve(3, COLUMN_BLOCK + 1, 8)
    assert kv.slots == 4 and kv.columns == 2 * COLUMN_BLOCK and kv.keys[0].shape == (4, 1, 2 * COLUMN_BLOCK, 1)
    assert cached(kv, 2, 3) == [[50, 51, 0], [61, 60, 0]] and kv.col.tolist() == [2, 0, 0, 0]


class _Attention(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


def test_grouped_decode_attention_equals_sdpa_over_repeated_kv_heads():
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 8, 1, 16, generator=gen)  # [R, Hq, 1, D]
    key, value = torch.randn(2, 3, 4, 10, 16, generator=gen)  # [R, Hkv, W, D] each
    mask = torch.arange(10)[None, :] < torch.tensor([[10], [4], [7]])  # [R, W]
    ours, _ = slot_attention(_Attention(), query, key, value, mask[:, None, None, :], scaling=0.25, slot_decode=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=mask[:, None, None, :],
        scale=0.25).transpose(1, 2)  # [R, 1, Hq, D]
    assert ours.shape == (3, 1, 8, 16) and torch.allclose(ours, want, atol=1e-5)


def test_a_fused_forward_packs_the_decodes_then_the_chunks_and_writes_each_token_at_its_own_slot_and_column():
    kv = toy_slots()
    kv.add(2)
    prefill(kv, [[5, 6, 7], [8, 9]], [1, 2], done=2)  # running: slot 0 at column 3, slot 1 at column 2
    kv.add(2)
    prefill(kv, [[4]], [3], done=0)  # prefilling: slot 2 has one column filled; slot 3 none
    inputs = kv.fused_inputs([[6, 6], [7, 7, 7]])
    assert inputs["input_ids"].tolist() == [[100, 101, 6, 6, 7, 7, 7]]
    assert inputs["position_ids"].tolist() == [[3, 2, 1, 2, 0, 1, 2]]
    assert inputs["attention_mask"][:, 0, 0].tolist() == [[True] * 4, [True, True, True, False]]
    assert kv.fused_ends() == [0, 1, 3, 6]  # each decode, then each chunk's last token
    plan = kv.plan
    assert (plan.rows, plan.decode_width, plan.chunks) == (2, 4, [(2, 2, 1), (4, 3, 0)])
    assert plan.masks[0].tolist() == [[True, True, False], [True, True, True]]  # causal after the filled column
    states = torch.tensor([70.0, 80.0, 31.0, 32.0, 40.0, 41.0, 42.0]).view(1, 1, 7, 1)
    keys, _ = kv.update(states, states.clone(), 0)
    assert cached(kv, 4, 4) == [[10, 11, 12, 70], [21, 22, 80, 0], [30, 31, 32, 0], [40, 41, 42, 0]]
    kv.decoded(torch.tensor([11, 12]))
    kv.prefilled(torch.tensor([103]), done=1)  # slot 2's last chunk ran; slot 3 goes on prefilling
    assert kv.col_h == [4, 3, 3] and kv.fill_h == [3] and kv.tokens.tolist()[:3] == [11, 12, 103]


def test_fused_attention_equals_a_decode_step_and_a_causal_prefill_of_each_chunk():
    gen = torch.Generator().manual_seed(1)
    kv = SlotKV(torch, torch.device("cpu"), torch.float32, layers=1, kv_heads=2, head_dim=8)
    kv.reserve(3, 8, 3)
    kv.keys[0][:, :, :8] = torch.randn(3, 2, 8, 8, generator=gen)
    kv.values[0][:, :, :8] = torch.randn(3, 2, 8, 8, generator=gen)
    kv.col_h, kv.fill_h = [3], [3, 0]  # slot 0 runs (3 columns); slot 1 is filled to column 3; slot 2 is empty
    kv.col[0] = 3
    inputs = kv.fused_inputs([[1, 2], [3, 4, 5]])
    query = torch.randn(1, 4, 6, 8, generator=gen)  # [1, Hq, T, D]: G = 2
    new_k, new_v = torch.randn(2, 1, 2, 6, 8, generator=gen)
    key, value = kv.update(new_k, new_v, 0)
    ours, _ = slot_attention(_Attention(), query, key, value, inputs["attention_mask"], scaling=0.3,
                             slot_fused=inputs["slot_fused"])
    rep = dict(dim=1, repeats=2)
    want = [torch.nn.functional.scaled_dot_product_attention(  # the decode: slot 0 over columns 0..3
        query[:, :, :1], key[:1, :, :4].repeat_interleave(**rep), value[:1, :, :4].repeat_interleave(**rep),
        scale=0.3)]
    for slot, (start, n, fill) in ((1, (1, 2, 3)), (2, (3, 3, 0))):  # each chunk causally over its own row
        seen = fill + n
        mask = torch.arange(seen)[None, :] <= fill + torch.arange(n)[:, None]
        want.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:start + n], key[slot:slot + 1, :, :seen].repeat_interleave(**rep),
            value[slot:slot + 1, :, :seen].repeat_interleave(**rep), attn_mask=mask, scale=0.3))
    want = torch.cat(want, dim=2).transpose(1, 2)  # [1, T, Hq, D]
    assert ours.shape == (1, 6, 4, 8) and torch.allclose(ours, want, atol=1e-5)
    assert torch.equal(key[1, :, 3:5], new_k[0, :, 1:3]) and torch.equal(key[0, :, 3], new_k[0, :, 0])
