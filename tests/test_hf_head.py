"""worker.hf.head: the plan table from measured times, and the hooks that pad a head's input rows, run the
planned form and cut its output back (the logits of the real rows unchanged)."""
import pytest
import torch

from batchlab.worker.hf.head import HeadPlan, head_times, plan_table, product


def linear_only(times: list[float]) -> list[tuple[str, int]]:
    return plan_table({"linear": times, "transposed": [t * 10 for t in times]})


def test_each_row_count_goes_to_the_fastest_count_at_or_above_it_when_that_gains_enough():
    # this CPU's tiny-mistral head, ms for 1..8 rows: 2 and 3 rows are slower than 4 or 5
    times = [8.4, 16.4, 23.8, 14.0, 12.1, 14.3, 21.3, 15.3]
    assert [k for _, k in linear_only(times)] == [0, 1, 5, 5, 5, 5, 6, 8, 8]
    assert [k for _, k in linear_only([10.0, 9.5])] == [0, 1, 2]  # 5% faster is noise: 1 row stays 1
    assert [k for _, k in linear_only([10.0, 20.0, 30.0])] == [0, 1, 2, 3]  # monotonic: nothing moves


def test_the_fastest_form_and_count_win_and_noise_keeps_linear():
    # this CPU's tiny-mistral head in both forms, ms for 1..4 rows
    table = plan_table({"linear": [6.2, 12.5, 18.5, 10.2], "transposed": [5.8, 1.6, 2.4, 2.6]})
    assert table == [("linear", 0), ("transposed", 2), ("transposed", 2), ("transposed", 3), ("transposed", 4)]
    assert plan_table({"linear": [10.0], "transposed": [9.5]}) == [("linear", 0), ("linear", 1)]  # 5%: noise


@pytest.mark.parametrize("form", ["linear", "transposed"])
def test_both_forms_compute_the_same_product(form):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 16), torch.randn(50, 16), torch.randn(50)
    torch.testing.assert_close(product(form, x, w, b), torch.nn.functional.linear(x, w, b))


@pytest.mark.parametrize("form", ["linear", "transposed"])
def test_the_hooks_pad_the_rows_the_head_computes_and_return_only_the_real_ones(form):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    x3, x2 = torch.randn(1, 3, 16), torch.randn(2, 1, 16)
    plain3, plain2 = head(x3), head(x2)
    plan = HeadPlan(head, [("linear", 0), (form, 1), (form, 5), (form, 5), ("linear", 4)])
    computed = []
    head.register_forward_pre_hook(lambda _m, args: computed.append((tuple(args[0].shape), plan.call[2])))
    out3, out2 = head(x3), head(x2)
    assert computed == [((5, 16), form), ((5, 16), form)]
    assert out3.shape == (1, 3, 50) and out2.shape == (2, 1, 50) and out3.is_contiguous()
    torch.testing.assert_close(out3, plain3)
    torch.testing.assert_close(out2, plain2)
    x1 = torch.randn(1, 1, 16)
    torch.testing.assert_close(head(x1), torch.nn.functional.linear(x1, head.weight))  # 1 row in `form`, unpadded
    assert head(torch.randn(4, 16)).shape == (4, 50) and computed[-1] == ((4, 16), "linear")  # as it is
    assert head(torch.randn(7, 16)).shape == (7, 50)  # beyond the table: as it is
    plan.remove()
    head(x3)
    assert computed[-1][0] == (1, 3, 16) and "forward" not in vars(head)


def test_head_times_times_every_row_count_with_the_clock_given():
    ticks = iter(range(1000))
    head = torch.nn.Linear(4, 3)
    times = head_times(head, 3, 4, torch.device("cpu"), torch.float32, lambda: None, lambda: next(ticks))
    assert times == [1, 1, 1]  # each call between two clock reads: one tick
