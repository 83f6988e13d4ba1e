"""SlotKV bookkeeping on toy tensors (prefill into free slots, in-place decode writes, per-row masks and
positions, freeing a slot by moving the last row, growth) and the grouped-query decode attention."""
import torch

from batchlab.worker.hf_slots import COLUMN_BLOCK, SlotKV, slot_attention


def toy_slots(rows: int = 4) -> SlotKV:
    kv = SlotKV(torch, torch.device("cpu"), torch.float32, layers=1, kv_heads=1, head_dim=1)
    kv.reserve(rows, 4, rows)
    return kv


def column(x: float, width: int) -> torch.Tensor:
    return torch.full((1, 1, width, 1), float(x))  # one row's K/V [1, Hkv, S, D]


def prefill(kv: SlotKV, ids: list[list[int]], pads: list[int], marks: list[float]) -> dict:
    """Prefill rows whose K/V are constant `marks` (one per row), first tokens 100 + row."""
    inputs = kv.prefill_inputs(ids, pads)
    states = torch.cat([column(m, len(ids[0])) for m in marks])
    kv.update(states, states.clone(), 0)
    kv.prefilled(torch.tensor([100 + i for i in range(len(ids))]))
    return inputs


def test_a_prefill_writes_joiners_into_the_next_free_slots_with_their_own_positions():
    kv = toy_slots()
    inputs = prefill(kv, [[5, 6, 7], [0, 8, 9]], [0, 1], [1.0, 2.0])
    assert inputs["position_ids"].tolist() == [[0, 1, 2], [0, 0, 1]]
    assert inputs["attention_mask"][1, 0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    prefill(kv, [[4, 4]], [0], [3.0])
    assert kv.rows == 3 and kv.col_h == [3, 3, 2] and kv.start_h == [0, 1, 0]
    assert kv.keys[0][:3, 0, :3, 0].tolist() == [[1, 1, 1], [2, 2, 2], [3, 3, 0]]


def test_a_decode_step_writes_each_row_in_place_at_its_own_column_and_masks_by_length():
    kv = toy_slots()
    prefill(kv, [[5, 6, 7], [0, 8, 9]], [0, 1], [1.0, 2.0])
    prefill(kv, [[4, 4]], [0], [3.0])
    storage = kv.keys[0].data_ptr()
    inputs = kv.decode_inputs()
    assert inputs["input_ids"].tolist() == [[100], [101], [100]]
    assert inputs["position_ids"].tolist() == [[3], [2], [2]]
    assert inputs["attention_mask"][:, 0, 0].tolist() == [[True] * 4, [False, True, True, True],
                                                         [True, True, True, False]]
    keys, _ = kv.update(torch.tensor([7.0, 8.0, 9.0]).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1), 0)
    assert keys.shape == (3, 1, 4, 1) and keys[:, 0, :, 0].tolist() == [[1, 1, 1, 7], [2, 2, 2, 8], [3, 3, 9, 0]]
    kv.decoded(torch.tensor([11, 12, 13]))
    assert kv.col_h == [4, 4, 3] and kv.col.tolist()[:3] == [4, 4, 3] and kv.keys[0].data_ptr() == storage
    assert kv.decode_inputs()["input_ids"].tolist() == [[11], [12], [13]]


def test_a_finished_row_frees_its_slot_and_the_last_row_moves_in():
    kv = toy_slots()
    prefill(kv, [[1], [2], [3]], [0, 0, 0], [1.0, 2.0, 3.0])
    prefill(kv, [[9, 9]], [1], [4.0])
    order = kv.release([0, 2])
    assert order == [3, 1] and kv.rows == 2 and kv.start_h == [1, 0] and kv.col_h == [2, 1]
    assert kv.keys[0][:2, 0, :2, 0].tolist() == [[4, 4], [2, 0]]
    assert kv.start.tolist()[:2] == [1, 0] and kv.tokens.tolist()[:2] == [100, 101]
    assert kv.release([1]) == [0] and kv.release([0]) == [] and kv.rows == 0


def test_growing_the_cache_keeps_the_running_rows():
    kv = toy_slots(rows=1)
    prefill(kv, [[1, 2]], [0], [5.0])
    kv.reserve(3, COLUMN_BLOCK + 1, 8)
    assert kv.slots == 3 and kv.columns == 2 * COLUMN_BLOCK and kv.keys[0].shape == (3, 1, 2 * COLUMN_BLOCK, 1)
    assert kv.keys[0][0, 0, :3, 0].tolist() == [5, 5, 0] and kv.col.tolist() == [2, 0, 0]


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
