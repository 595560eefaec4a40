"""A convolution's gradients (portkit/tensor/spatial.py): the input gradient is a convolution of the
output gradient, the weight gradient is one sum over the batch and the output positions that
codegen/pack.py blocks as a matmul; each against torch on odd shapes, strides, dilation,
groups, padding modes and float16."""
from __future__ import annotations

from math import prod

import numpy as np
import pytest
import torch

from portkit import runtime, schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.codegen.plan import SERIAL, plan
from portkit.graph import GraphOp, walk
from portkit.nn import functional as F
from portkit.tensor import Tensor, float16


def _vector() -> str:
    """The cpu backend's vector type for float32 (codegen/lanes.py): one host register."""
    renderer = runtime.get("cpu").device.renderer
    return f"{renderer.vector_types[dtypes.float32]}x{renderer.vector_bytes // 4}"


TF = torch.nn.functional


def _grads(device, x, w, seed=0, dtype=None, **kwargs):
    """(y, dx, dw) of sum(conv(x, w) * r) in portkit and in torch (float64)."""
    d = x.ndim - 2
    px = Tensor(x, dtype, device=device, requires_grad=True)
    pw = Tensor(w, dtype, device=device, requires_grad=True)
    y = getattr(F, f"conv{d}d")(px, pw, **kwargs)
    r = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)
    (y * Tensor(r, dtype, device=device)).sum().backward()
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    tw = torch.from_numpy(w.astype(np.float64)).requires_grad_()
    ty = getattr(TF, f"conv{d}d")(tx, tw, **kwargs)
    (ty * torch.from_numpy(r.astype(np.float64))).sum().backward()
    return (y, px.grad, pw.grad), (ty, tx.grad, tw.grad)


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("x_shape, w_shape, kwargs", [
    ((2, 3, 7, 9), (4, 3, 3, 3), {"padding": 1}),
    ((1, 4, 11, 10), (6, 2, 3, 3), {"stride": 2, "padding": 1, "groups": 2}),
    ((2, 3, 10, 13), (3, 3, 3, 2), {"padding": 2, "dilation": 2}),
    ((2, 2, 8, 9), (4, 2, 3, 3), {"padding": "same", "dilation": (2, 1)}),
    ((1, 2, 9, 9), (2, 2, 2, 2), {"stride": 2, "padding": 3}),     # padding > kernel reach
    ((1, 2, 5, 6), (2, 2, 5, 5), {"padding": 4}),
    ((2, 3, 13), (4, 3, 4), {"stride": 3}),
    ((1, 2, 5, 6, 7), (2, 2, 3, 3, 3), {"stride": (1, 2, 1), "padding": 1}),
])
@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_conv_gradients_match_torch(device, x_shape, w_shape, kwargs):
    ours, theirs = _grads(device, _data(*x_shape), _data(*w_shape, seed=1), **kwargs)
    for name, a, b in zip(("output", "input grad", "weight grad"), ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_conv_gradients_through_a_padding_mode(mode):
    # what torch's Conv2d(padding_mode=mode) computes: pad(x, mode), then a convolution
    x, w = _data(2, 3, 8, 7), _data(4, 3, 3, 3, seed=1)
    px, pw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    y = F.conv2d(F.pad(px, (1, 2, 2, 1), mode=mode), pw)
    (y * y).sum().backward()
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = TF.conv2d(TF.pad(tx, (1, 2, 2, 1), mode=mode), tw)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_float16_conv_gradients_sum_in_float32():
    x, w = _data(2, 8, 12, 16), _data(8, 8, 3, 3, seed=1)
    x, w = x.astype(np.float16).astype(np.float32), w.astype(np.float16).astype(np.float32)
    ours, theirs = _grads("cpu", x, w, dtype=float16, padding=1)
    assert ours[1].dtype == ours[2].dtype == float16
    for a, b in zip(ours[1:], theirs[1:]):
        b = b.numpy()
        # one float16 rounding of the result, not one per partial sum
        np.testing.assert_allclose(a.numpy().astype(np.float64), b, rtol=2e-3,
                                   atol=2e-3 * np.abs(b).max())


def test_only_the_gradients_asked_for_flow():
    x, w = _data(1, 2, 6, 6), _data(3, 2, 3, 3, seed=1)
    px, pw = Tensor(x), Tensor(w, requires_grad=True)
    px.conv2d(pw, padding=1).sum().backward()
    assert px.grad is None and pw.grad is not None
    tx, tw = torch.from_numpy(x), torch.from_numpy(w).requires_grad_()
    TF.conv2d(tx, tw, padding=1).sum().backward()
    np.testing.assert_allclose(pw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def _backward_schedule(which: str):
    x, w = _data(2, 16, 12, 16), _data(16, 16, 3, 3, seed=1)
    px, pw = Tensor(x, device="cpu", requires_grad=True), Tensor(w, device="cpu",
                                                                requires_grad=True)
    r = Tensor(_data(2, 16, 12, 16, seed=2), device="cpu").realize()
    (px.conv2d(pw, padding=1) * r).sum().backward()
    grad = px.grad if which == "input" else pw.grad
    return schedule.create_schedule([grad.lazy])


def test_the_input_gradient_is_a_convolution_of_the_output_gradient():
    # before: a reduce over the output channels into nine shifted planes (9x the input), then
    # a gated sum of them; now the padded gradient's copy and one convolution kernel
    items = _backward_schedule("input")
    assert max(prod(it.root.shape) for it in items) <= prod((2, 16, 14, 18))
    conv = items[-1]
    tiles = dict(plan(conv.root, conv.inputs, SERIAL).upcast)
    assert tiles.get(3, 1) > 1 and tiles.get(1, 1) > 1, tiles


def _the_sum(items):
    """The last kernel of `items` that sums (a reduce under its root): the weight gradient."""
    return [it for it in items if any(n.op is GraphOp.REDUCE for n in walk(
        [it.root], stop=lambda n, it=it: any(n is x for x in it.inputs)).order)][-1]


def _packed(item):
    """The packing codegen/pack.py finds for `item` on the cpu, and the kernel's C source."""
    device = runtime.get("cpu")
    found = pack.find(item.root, item.inputs, device.capabilities)
    assert found is not None, "not packed"
    return found, device.compile(lower(item.root, item.inputs, device.capabilities)).source


def test_the_weight_gradient_is_a_packed_matmul_over_the_batch_and_positions():
    # one sum over (batch, *out) with m = (cin, *kernel) and n = cout: the windows staged once
    # per group and depth block, vector FMAs into register blocks (before: a first sum that
    # kept the batch and 8 lanes, scalar register tiles, and a second sum)
    item = _the_sum(_backward_schedule("weight"))
    (found, packing), source = _packed(item)
    assert found.sizes == (16 * 3 * 3, 16, 2 * 12 * 16) and len(found.k_axes) == 3
    assert packing.packed_a and f"= {_vector()}_fma(" in source
    assert _ops_of(item).count(Op.LOCAL) >= 2


def _ops_of(item) -> list[Op]:
    return [n.op for n in lower(item.root, item.inputs, runtime.get("cpu").capabilities).nodes]


def test_relus_mask_of_the_output_gradient_is_staged_with_the_panel():
    # dy * (h > 0) is computed into the B panel once per group and depth block: one compare
    # in the kernel, none among the multiply-adds
    x, w = _data(2, 16, 12, 16), _data(16, 16, 3, 3, seed=1)
    px = Tensor(x, device="cpu")
    pw = Tensor(w, device="cpu", requires_grad=True)
    h = px.conv2d(pw, padding=1)
    (h.relu() * Tensor(_data(2, 16, 12, 16, seed=2), device="cpu")).sum().backward()
    item = _the_sum(schedule.create_schedule([pw.grad.lazy]))
    _packed(item)
    assert _ops_of(item).count(Op.CMPLT) == 1
    tx, tw = torch.from_numpy(x).double(), torch.from_numpy(w).double().requires_grad_()
    r = torch.from_numpy(_data(2, 16, 12, 16, seed=2)).double()
    (TF.conv2d(tx, tw, padding=1).relu() * r).sum().backward()
    _relative(pw.grad.numpy(), tw.grad.numpy())


def test_a_long_weight_gradient_is_split_and_its_first_stage_is_packed():
    # k = 8 * 48 * 48 = 18432 terms, more than a stage sums (16384): the output rows are cut
    # into 2 x 32 (padded from 48), and the split moves that reshape and padding into the
    # product's factors, so the partial sums are still a matmul (a view of the product was not)
    px = Tensor(_data(8, 8, 48, 48), device="cpu")
    pw = Tensor(_data(8, 8, 3, 3, seed=1), device="cpu", requires_grad=True)
    (px.conv2d(pw, padding=1) * Tensor(_data(8, 8, 48, 48, seed=2), device="cpu")).sum().backward()
    items = schedule.create_schedule([pw.grad.lazy])
    first = next(it for it in items if any(n.op is GraphOp.REDUCE for n in walk(
        [it.root], stop=lambda n, it=it: any(n is x for x in it.inputs)).order))
    (found, _), _ = _packed(first)
    assert found.sizes[2] <= 16384 and prod(first.root.shape) == 2 * 8 * 8 * 9


def _relative(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-5) -> None:
    """Equal to `rtol` relative to the largest expected magnitude."""
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


@pytest.mark.parametrize("x_shape, w_shape, kwargs", [
    ((4, 8, 16, 16), (16, 8, 3, 3), {"padding": 1}),
    ((4, 8, 17, 15), (16, 8, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 16, 12, 12), (32, 16, 1, 1), {}),
    ((2, 8, 14, 13), (16, 8, 3, 3), {"padding": 2, "dilation": 2}),
    ((2, 16, 10, 12), (32, 8, 3, 3), {"padding": 1, "groups": 2}),
    ((2, 3, 16, 16), (8, 3, 5, 5), {"stride": (1, 2), "padding": (2, 1)}),
    ((8, 8, 48, 48), (8, 8, 3, 3), {"padding": 1}),      # k = 18432: split, cut rows padded
])
def test_packed_weight_gradients_match_torch_to_1e_5(x_shape, w_shape, kwargs):
    ours, theirs = _grads("cpu", _data(*x_shape), _data(*w_shape, seed=1), **kwargs)
    _relative(ours[2].numpy(), theirs[2].detach().numpy())


def test_the_gradient_of_a_sum_is_copied_padded_before_the_input_gradient():
    # sum()'s gradient is a constant; its padded view (expanded and masked on the same axes)
    # gets a copy of its own too, so the input gradient's lanes carry no padding gate
    px = Tensor(_data(2, 16, 12, 16), device="cpu", requires_grad=True)
    pw = Tensor(_data(16, 16, 3, 3, seed=1), device="cpu")
    px.conv2d(pw, padding=1).sum().backward()
    items = schedule.create_schedule([px.grad.lazy])
    assert len(items) == 2 and items[0].root.shape == (2, 16, 1, 14, 1, 18)
    tiles = dict(plan(items[-1].root, items[-1].inputs, SERIAL).upcast)
    assert tiles.get(3, 1) > 1 and tiles.get(1, 1) > 1, tiles
    expected = torch.nn.functional.conv_transpose2d(
        torch.ones(2, 16, 12, 16), torch.from_numpy(_data(16, 16, 3, 3, seed=1)), padding=1)
    np.testing.assert_allclose(px.grad.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_the_padded_copy_of_a_masked_gradient_indexes_like_a_padded_load():
    # relu's mask of dy, padded for the input gradient: its loads keep the pad's shift on each
    # axis, so the copy costs the divs and mods of a padded load's copy, where unravelling the
    # flat index added five per element
    def copy_ops(value):
        item = schedule.create_schedule([value.pad(((0, 0), (0, 0), (1, 1), (1, 1))).lazy])[0]
        return [op for op in _ops_of(item) if op in (Op.IDIV, Op.MOD)]
    dy = Tensor(_data(2, 16, 12, 16), device="cpu").realize()
    h = Tensor(_data(2, 16, 12, 16, seed=1), device="cpu").realize()
    assert copy_ops(dy * (h > 0)) == copy_ops(dy)
    expected = np.pad(_data(2, 16, 12, 16) * (_data(2, 16, 12, 16, seed=1) > 0),
                      ((0, 0), (0, 0), (1, 1), (1, 1)))
    np.testing.assert_array_equal((dy * (h > 0)).pad(((0, 0), (0, 0), (1, 1), (1, 1))).numpy(),
                                  expected)


def test_the_weight_gradients_staged_copies_walk_output_rows():
    # k = (batch, 12, 16) in depth blocks of 192: each block is staged as 12 runs of an output
    # row (16), so a position along k is affine in the inner counter, never a div or a mod of it
    item = _the_sum(_backward_schedule("weight"))
    _packed(item)
    nodes = lower(item.root, item.inputs, runtime.get("cpu").capabilities).nodes
    runs = [i for i, n in enumerate(nodes) if n.op is Op.RANGE and nodes[n.src[1]].arg == 16]
    assert len(runs) >= 2      # the windows' staging and the gradient's panel copy
    assert not [n for n in nodes if n.op in (Op.IDIV, Op.MOD) and set(n.src) & set(runs)]


def test_a_costly_output_gradient_is_evaluated_once_per_group_that_repays_it():
    # BatchNorm's gradient under a stem's weight gradient (m = 3 * 3 * 3 = 27 rows of 3-row
    # blocks): no blocking leaves 16 groups, and the fallback is no longer one block per group,
    # which evaluated the gradient into the panel 9 times, but the fewest blocks whose rows
    # repay its ops: all 27 rows in one group here
    px = Tensor(_data(2, 3, 48, 64), device="cpu")
    pw = Tensor(_data(16, 3, 3, 3, seed=1), device="cpu", requires_grad=True)
    h = F.batch_norm(px.conv2d(pw, padding=1), None, None, training=True).relu()
    (h * Tensor(_data(2, 16, 48, 64, seed=2), device="cpu")).sum().backward()
    item = _the_sum(schedule.create_schedule([pw.grad.lazy]))
    (found, packing), _ = _packed(item)
    assert found.sizes[:2] == (27, 16) and packing.rows * packing.blocks == 27
    tx = torch.from_numpy(_data(2, 3, 48, 64)).double()
    tw = torch.from_numpy(_data(16, 3, 3, 3, seed=1)).double().requires_grad_()
    th = TF.batch_norm(TF.conv2d(tx, tw, padding=1), None, None, training=True).relu()
    (th * torch.from_numpy(_data(2, 16, 48, 64, seed=2)).double()).sum().backward()
    _relative(pw.grad.numpy(), tw.grad.numpy(), rtol=1e-4)
