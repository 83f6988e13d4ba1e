"""The batch timeline draws every row on one batch-size scale: a size-4 batch is half a size-8 one."""
import pandas as pd

from batchlab.report.plots import ROW_HEIGHT, bar_heights, shared_scale


def _act(*sizes: int) -> pd.DataFrame:
    n = len(sizes)
    return pd.DataFrame({"start": range(n), "end": range(1, n + 1), "size": sizes, "reason": "size"})


def test_rows_share_one_batch_size_scale():
    naive, dynamic = _act(4, 4, 4), _act(8, 2)
    top = shared_scale([naive, dynamic])
    assert top == 8
    assert list(bar_heights(naive, top)) == [ROW_HEIGHT / 2] * 3
    assert list(bar_heights(dynamic, top)) == [ROW_HEIGHT, ROW_HEIGHT / 4]


def test_an_empty_window_keeps_a_positive_scale():
    assert shared_scale([_act(), _act()]) == 1.0
