"""worker.hf_head: the row-count table from measured times, and the hooks that pad a head's input rows and
cut its output back (the logits of the real rows unchanged)."""
import torch

from batchlab.worker.hf_head import RowPadding, head_times, pad_table


def test_each_row_count_goes_to_the_fastest_count_at_or_above_it_when_that_gains_enough():
    # this CPU's tiny-mistral head, ms for 1..8 rows: 2 and 3 rows are slower than 4 or 5
    times = [8.4, 16.4, 23.8, 14.0, 12.1, 14.3, 21.3, 15.3]
    assert pad_table(times) == [0, 1, 5, 5, 5, 5, 6, 8, 8]
    assert pad_table([10.0, 9.5]) == [0, 1, 2]  # 5% faster is noise: 1 row stays 1
    assert pad_table([10.0, 20.0, 30.0]) == [0, 1, 2, 3]  # monotonic: nothing moves


def test_the_hooks_pad_the_rows_the_head_computes_and_return_only_the_real_ones():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    x3, x2 = torch.randn(1, 3, 16), torch.randn(2, 1, 16)
    plain3, plain2 = head(x3), head(x2)
    padding = RowPadding(head, [0, 1, 5, 5, 4])
    computed = []
    head.register_forward_pre_hook(lambda _m, args: computed.append(tuple(args[0].shape)))  # runs after the pad
    out3, out2 = head(x3), head(x2)
    assert computed == [(5, 16), (5, 16)]
    assert out3.shape == (1, 3, 50) and out2.shape == (2, 1, 50)
    torch.testing.assert_close(out3, plain3)
    torch.testing.assert_close(out2, plain2)
    assert head(torch.randn(4, 16)).shape == (4, 50) and computed[-1] == (4, 16)  # table[4] = 4: as it is
    assert head(torch.randn(7, 16)).shape == (7, 50)  # beyond the table: as it is
    padding.remove()
    head(x3)
    assert computed[-1] == (1, 3, 16)


def test_head_times_times_every_row_count_with_the_clock_given():
    ticks = iter(range(1000))
    head = torch.nn.Linear(4, 3)
    times = head_times(head, 3, 4, torch.device("cpu"), torch.float32, lambda: None, lambda: next(ticks))
    assert times == [1, 1, 1]  # each call between two clock reads: one tick
