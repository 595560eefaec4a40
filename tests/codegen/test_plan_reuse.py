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
