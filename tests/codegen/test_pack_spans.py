"""A conv's weight gradient (a sum over the batch and the output positions, its windows staged
per group and depth block) takes groups that span several panels along n where the device's
workgroup memory holds their running sums (codegen/pack.py `_spanned`): each group stages its
windows once for all its panels instead of once per panel. Against torch (float64), on the cpu
backend and in the interpreter."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from portkit import runtime, schedule
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.tensor import Tensor, cat
from tests.codegen.test_conv_taps import LOOPS, _data

TF = torch.nn.functional
ROOMY = dataclasses.replace(LOOPS, local_memory_bytes=1024 * 1024)


def _weight_gradient(x_shape, w_shape, device="cpu", relu=True, **kwargs):
    """(the weight gradient's kernel, pw, its torch twin, the data) of sum(relu(conv) * r)."""
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    pw = Tensor(w, device=device, requires_grad=True)
    y = Tensor(x, device=device).conv2d(pw, **kwargs)
    r = _data(*y.shape, seed=2)
    ((y.relu() if relu else y) * Tensor(r, device=device)).sum().backward()
    items = schedule.create_schedule([pw.grad.lazy])
    item = next(it for it in items
                if (found := pack.find(it.root, it.inputs, ROOMY)) and found[0].k_fold)
    tw = torch.from_numpy(w).double().requires_grad_()
    ty = TF.conv2d(torch.from_numpy(x).double(), tw, **kwargs)
    ((ty.relu() if relu else ty) * torch.from_numpy(r).double()).sum().backward()
    return item, pw, tw.grad.numpy()


def test_a_weight_gradient_spans_panels_where_their_sums_fit():
    item, _, _ = _weight_gradient((32, 64, 4, 4), (128, 64, 3, 3), padding=1)
    found, packing = pack.find(item.root, item.inputs, ROOMY)
    assert found.sizes == (64 * 9, 128, 32 * 16)
    # the windows are staged once per group for all its panels
    assert packing.spans > 1 and packing.packed_a, packing
    # the running sums of every panel spanned fit the device's workgroup memory
    for caps in (ROOMY, LOOPS):
        assert pack.find(item.root, item.inputs, caps)[1].local_bytes(4) <= \
            caps.local_memory_bytes


@pytest.mark.parametrize("x_shape, w_shape, kwargs, relu", [
    ((32, 64, 4, 4), (128, 64, 3, 3), {"padding": 1}, True),
    ((8, 32, 8, 8), (64, 32, 3, 3), {"padding": 1}, False),
    ((32, 128, 4, 4), (200, 128, 3, 3), {"padding": 1}, True),   # 200: a partial panel
    ((8, 24, 9, 9), (64, 24, 3, 3), {"stride": 2, "padding": 1}, True),
])
def test_spanned_weight_gradients_match_torch_on_the_cpu(x_shape, w_shape, kwargs, relu):
    item, pw, expected = _weight_gradient(x_shape, w_shape, relu=relu, **kwargs)
    assert pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)[1].spans > 1
    bound = 1e-5 * np.abs(expected).max()
    np.testing.assert_allclose(pw.grad.numpy(), expected, rtol=0, atol=bound)


def test_a_spanned_weight_gradient_computes_in_the_interpreter():
    # the interpreter's schedule keeps the padding inside the kernel: its inputs are x and r
    x_shape, w_shape = (4, 8, 6, 6), (64, 8, 3, 3)
    item, _, expected = _weight_gradient(x_shape, w_shape, device="interpreter", relu=False,
                                         padding=1)
    assert pack.find(item.root, item.inputs, ROOMY)[1].spans > 1
    kernel = lower(item.root, item.inputs, ROOMY)
    x, r = _data(*x_shape), _data(4, 64, 6, 6, seed=2)
    by_size = {x.size: x.ravel(), r.size: r.ravel()}
    inputs = [by_size[int(np.prod(node.shape))] for node in item.inputs]
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(expected.size, np.float32),
                                             *inputs)
    np.testing.assert_allclose(out.reshape(expected.shape), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())


def test_a_weight_gradient_takes_fewer_groups_on_a_device_of_few_units():
    item, _, _ = _weight_gradient((32, 64, 16, 16), (128, 64, 3, 3), padding=1)
    grids = {}
    for units in (None, 1, 2):
        caps = dataclasses.replace(ROOMY, compute_units=units)
        grids[units] = lower(item.root, item.inputs, caps).grid[0]
    # 16 groups where no units are stated; 4 per unit stated
    assert grids[None] >= 16 and grids[1] <= 4 and grids[2] <= 8, grids


def test_the_cpu_backend_states_a_unit_per_thread():
    from portkit.reference_backends.cpu.runtime import threads
    assert runtime.get("cpu").capabilities.compute_units == threads()


def test_a_staged_a_that_is_more_than_a_load_spans_panels():
    # attention's q, k and v input gradients concatenated, times the projection's weights: A
    # is three gated loads per element, staged once for all of a group's panels, not once a panel
    parts = [_data(256, 128, seed=s) for s in range(3)]
    w = _data(384, 256, seed=3)
    out = cat([Tensor(p, device="cpu") for p in parts], dim=1) @ Tensor(w, device="cpu")
    item, = [it for it in schedule.create_schedule([out.lazy])
             if pack.find(it.root, it.inputs, ROOMY)]
    packing = pack.find(item.root, item.inputs, ROOMY)[1]
    assert packing.packed_a and packing.spans > 1, packing
    expected = np.concatenate(parts, 1).astype(np.float64) @ w
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_a_staged_a_times_a_transposed_b_copies_each_panel_once():
    # layer 2 of an MLP, relu(h + b) @ W.T: spanning 4 panels staged A 4x less but copied
    # W's panels, a transposing copy an element at a time, 4x more; it ran in 0.95 ms
    # spanned, 0.47 with each group taking all 64 rows of one panel (one thread)
    h, bias, w = _data(64, 512), _data(512, seed=1), _data(512, 512, seed=2)
    out = (Tensor(h, device="cpu") + Tensor(bias, device="cpu")).relu() @ \
        Tensor(w, device="cpu").T
    item, = [it for it in schedule.create_schedule([out.lazy])
             if pack.find(it.root, it.inputs, LOOPS)]
    for caps in (LOOPS, runtime.get("cpu").capabilities):
        packing = pack.find(item.root, item.inputs, caps)[1]
        assert packing.packed_a and packing.spans == 1 and packing.rows * packing.blocks == 64
    expected = np.maximum(h.astype(np.float64) + bias, 0) @ w.T
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)
