"""`plan` upcasts an output axis for reuse only where a load that moves along the reduce ignores
it (a matmul's B row, a conv's weights): a load made once per output (a BatchNorm variance's
per-channel mean) is reused by nothing, and upcasting for it doubled a split variance's
partial sums."""
from __future__ import annotations

import numpy as np

from portkit import schedule
from portkit.codegen.plan import SERIAL, plan
from portkit.tensor import Tensor


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _plan_of(value):
    item = schedule.create_schedule([value.lazy])[-1]
    return dict(plan(item.root, item.inputs, SERIAL).upcast)


def test_a_per_output_load_is_no_reason_to_upcast():
    x, m = Tensor(_data(2, 16, 256), device="cpu"), Tensor(_data(1, 16, 1, seed=1), device="cpu")
    upcast = _plan_of(((x - m) * (x - m)).sum(-1))
    assert 0 not in upcast, upcast
    expected = ((_data(2, 16, 256) - _data(1, 16, 1, seed=1)) ** 2).sum(-1)
    np.testing.assert_allclose(((x - m) * (x - m)).sum(-1).numpy(), expected, rtol=1e-5)


def test_a_load_that_moves_along_the_reduce_is_still_reused():
    # x @ W.T, both along k: each row of W feeds every row of x
    x, w = Tensor(_data(8, 256), device="cpu"), Tensor(_data(64, 256, seed=1), device="cpu")
    assert len(_plan_of(x @ w.T)) >= 1


def test_a_column_sum_of_a_short_row_is_a_loop_not_written_out():
    # 64 rows x 10 columns (an MLP's last bias gradient) was written out term by term, 640
    # terms of straight-line C, 52 kB that took clang a quarter of a first training step
    from portkit import runtime
    from portkit.codegen.lower import lower
    x = Tensor(_data(64, 10), device="cpu")
    item, = schedule.create_schedule([x.sum(0).lazy])
    assert plan(item.root, item.inputs, SERIAL).inline is None
    kernel = lower(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert len(kernel.nodes) < 200, len(kernel.nodes)
    np.testing.assert_allclose(x.sum(0).numpy(), _data(64, 10).sum(0), rtol=1e-5)
    # a 2 x 2 window over a short row stays written out
    pool = Tensor(_data(2, 3, 8, 8), device="cpu").max_pool2d(2)
    item, = schedule.create_schedule([pool.lazy])
    assert plan(item.root, item.inputs, SERIAL).inline is not None


def test_a_sum_over_short_contiguous_rows_keeps_partial_sums():
    # a BatchNorm statistic on 16 x 16 and 8 x 8 maps: rows of 16 and 8, shorter than two
    # unrolls, still sum in as many partial sums as divide them, not in one chain of adds
    for size, sums in ((16, 16), (8, 8)):
        data = _data(4, 8, size, size)
        x = Tensor(data, device="cpu")
        item = schedule.create_schedule([x.sum((0, 2, 3)).lazy])[-1]
        assert plan(item.root, item.inputs, SERIAL).unroll == (3, sums), size
        np.testing.assert_allclose(x.sum((0, 2, 3)).numpy(), data.sum((0, 2, 3)), rtol=1e-5,
                                   atol=1e-4)
