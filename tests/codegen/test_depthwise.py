"""Depthwise convolutions (one input channel per group) on a device whose threads are loops: the
window's k^d terms are written out inside a loop along the output row (portkit/codegen/plan.py
`inline`, lower.py `written_out`), which the C compiler makes vector lanes; checked against torch
(float64) at odd sizes, strides, padding, dilation and channel multipliers, forward and
backward, and on the lowered kernel."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from portkit import schedule
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.plan import plan
from portkit.nn import functional as F
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor, float16

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
TF = torch.nn.functional


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# (x shape, w shape, kwargs): MobileNet's 3x3 s1/s2, EfficientNet's 5x5, ConvNeXt's 7x7 at odd
# sizes, dilation, a channel multiplier of 2 and 3, asymmetric strides, 1-d and 3-d
CASES = [
    ((2, 8, 13, 19), (8, 1, 3, 3), {"padding": 1, "groups": 8}),
    ((1, 6, 15, 17), (6, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 6}),
    ((1, 5, 14, 11), (5, 1, 5, 5), {"padding": 2, "groups": 5}),
    ((1, 6, 7, 7), (6, 1, 5, 5), {"padding": 2, "groups": 6}),
    ((2, 4, 9, 23), (4, 1, 7, 7), {"padding": 3, "groups": 4}),
    ((1, 3, 12, 21), (3, 1, 3, 3), {"padding": 2, "dilation": 2, "groups": 3}),
    ((2, 4, 10, 13), (8, 1, 3, 3), {"padding": 1, "groups": 4}),
    ((1, 3, 11, 16), (9, 1, 5, 3), {"stride": (1, 2), "padding": (2, 1), "groups": 3}),
    ((2, 6, 41), (6, 1, 5), {"stride": 2, "padding": 2, "groups": 6}),
    ((1, 4, 5, 6, 17), (4, 1, 3, 3, 3), {"padding": 1, "groups": 4}),
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs", CASES)
def test_depthwise_forward_and_gradients_match_torch_on_the_cpu(x_shape, w_shape, kwargs):
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    d = len(x_shape) - 2
    px, pw = (Tensor(a, device="cpu", requires_grad=True) for a in (x, w))
    y = getattr(F, f"conv{d}d")(px, pw, **kwargs)
    r = _data(*y.shape, seed=2)
    (y * Tensor(r, device="cpu")).sum().backward()
    tx, tw = (torch.from_numpy(a).double().requires_grad_() for a in (x, w))
    ty = getattr(TF, f"conv{d}d")(tx, tw, **kwargs)
    (ty * torch.from_numpy(r).double()).sum().backward()
    for ours, theirs in ((y, ty), (px.grad, tx.grad), (pw.grad, tw.grad)):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-5)


def _sum_item(x: np.ndarray, w: np.ndarray, **kwargs):
    """The scheduled kernel of the conv's sum (a padded copy comes before it)."""
    d = x.ndim - 2
    out = getattr(F, f"conv{d}d")(Tensor(x, device="cpu"), Tensor(w, device="cpu"), **kwargs)
    return schedule.create_schedule([out.lazy])[-1]


@pytest.mark.parametrize("k, stride", [(3, 1), (7, 1)])
def test_the_window_is_written_out_inside_a_loop_along_the_output_row(k, stride):
    # (1, 16, 64, 64): the kernel's innermost loop runs along the 64 / stride outputs of a row,
    # with the k x k terms in its body and no reduce loop, div or mod inside it (a row of under
    # 64 and 1536 terms is written out whole: below)
    item = _sum_item(_data(1, 16, 64, 64), _data(16, 1, k, k, seed=1), stride=stride,
                     padding=k // 2, groups=16)
    assert plan(item.root, item.inputs).inline is not None
    nodes = lower(item.root, item.inputs, LOOPS).nodes
    ranges = [i for i, n in enumerate(nodes) if n.op is Op.RANGE]
    inner = ranges[-1]
    assert nodes[nodes[inner].src[1]].arg == 64 // stride
    end = next(i for i, n in enumerate(nodes) if n.op is Op.END and n.src[0] == inner)
    body = [n.op for n in nodes[inner:end]]
    assert Op.RANGE not in body[1:] and Op.IDIV not in body and Op.MOD not in body
    loads = [n for n in nodes[inner:end] if n.op is Op.LOAD]
    assert len(loads) == 2 * k * k          # input and weight per term


@pytest.mark.parametrize("size, k, stride", [(14, 5, 1), (7, 5, 1), (28, 5, 2), (28, 7, 1),
                                             (56, 3, 1)])
def test_a_short_row_is_written_out_whole_in_each_step_of_the_loop(size, k, stride):
    # MobileNetV3's late maps (14x14 and 7x7 outputs), EfficientNet's 28 and 56-wide rows:
    # the loop runs over rows, and each step computes the row's outputs (every load before
    # the first store), not a loop of 14 trips that clang left scalar
    item = _sum_item(_data(1, 16, size, size), _data(16, 1, k, k, seed=1), stride=stride,
                     padding=k // 2, groups=16)
    row = size // stride
    tiling = plan(item.root, item.inputs)
    assert tiling.inline is not None and tiling.upcast == ((3, row),)
    nodes = lower(item.root, item.inputs, LOOPS).nodes
    inner = [i for i, n in enumerate(nodes) if n.op is Op.RANGE][-1]
    end = next(i for i, n in enumerate(nodes) if n.op is Op.END and n.src[0] == inner)
    body = [n.op for n in nodes[inner:end]]
    assert body.count(Op.STORE) == row and Op.RANGE not in body[1:]
    assert body.index(Op.STORE) > max(i for i, op in enumerate(body) if op is Op.LOAD)


def test_float16_depthwise_sums_in_float32():
    # 25 products of 0.1 * 0.1 rounded once, not after every float16 add
    x = np.full((1, 4, 9, 9), 0.1, np.float32)
    w = np.full((4, 1, 5, 5), 0.1, np.float32)
    out = F.conv2d(Tensor(x, float16, device="cpu"), Tensor(w, float16, device="cpu"), groups=4)
    exact = 25 * float(np.float16(0.1)) ** 2
    assert out.dtype == float16
    np.testing.assert_allclose(out.numpy().astype(np.float64), exact, rtol=1e-3)


@pytest.mark.parametrize("columns", [8, 64])
def test_a_plain_short_sum_keeps_its_reduce_loop(columns):
    # a sum of (4, columns) reads its terms along the reduced axis, not along the output row:
    # written out with its row of 4 it was 3 * 4 * 64 = 768 loads of straight-line code
    a, b, c = (Tensor(_data(4, columns, seed=s), device="cpu") for s in range(3))
    out = (a * b + c).relu().sum(axis=1)
    item, = schedule.create_schedule([out.lazy])
    assert plan(item.root, item.inputs).inline is None
    nodes = lower(item.root, item.inputs, LOOPS).nodes
    loads = sum(n.op is Op.LOAD for n in nodes)
    assert sum(n.op is Op.RANGE for n in nodes) == 2 and loads <= 3 * 16, loads
    expected = np.maximum(a.numpy() * b.numpy() + c.numpy(), 0).sum(1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
