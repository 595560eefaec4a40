"""A packed conv over a batch of small maps (ResNet's 4 x 4 and 8 x 8 stages on 32 x 32 images)
folds the batch into m (codegen/folds.py `batch_rows`), so a group's B panel (the weights)
serves many images' rows instead of being copied once per image, and its register blocks span
several output rows of a map narrower than the block; each conv against torch (float64),
forward and input gradient, in the interpreter and on the cpu backend."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from portkit import runtime
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.nn import functional as F
from portkit.tensor import Tensor
from tests.codegen.test_conv_taps import (
    LOOPS,
    TF,
    _close,
    _conv_item,
    _data,
    _divisions_in_multiply_add_loops,
)


@pytest.mark.parametrize("batch, size, rows", [(32, 4, 8), (8, 8, 8), (16, 3, 3), (4, 7, 7)])
def test_a_batch_of_small_maps_folds_into_m(batch, size, rows):
    item = _conv_item(_data(batch, 64, size, size), _data(64, 64, 3, 3, seed=1), padding=1)
    found, packing = pack.find(item.root, item.inputs, LOOPS)
    assert found.sizes[:2] == (batch * size * size, 64), "the batch is not folded into m"
    assert packing.rows == rows, packing
    kernel = lower(item.root, item.inputs, LOOPS)
    assert _divisions_in_multiply_add_loops(kernel) == []


def test_a_large_map_keeps_its_batch_out_of_m():
    item = _conv_item(_data(4, 32, 16, 16), _data(64, 32, 3, 3, seed=1), padding=1)
    found, _ = pack.find(item.root, item.inputs, LOOPS)
    assert found.sizes[0] == 256


def test_a_batch_folded_conv_computes_in_the_interpreter():
    x, w = _data(3, 16, 4, 4), _data(32, 16, 3, 3, seed=1)
    item = _conv_item(x, w, device="interpreter", padding=1)
    assert pack.find(item.root, item.inputs, LOOPS)[0].sizes[0] == 48
    kernel = lower(item.root, item.inputs, LOOPS)
    assert Op.MULACC in [n.op for n in kernel.nodes]
    by_size = {x.size: x.ravel(), w.size: w.ravel()}
    inputs = [by_size[int(np.prod(node.shape))] for node in item.inputs]
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(3 * 32 * 16, np.float32), *inputs)
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
    _close(out.reshape(3, 32, 4, 4), expected, 16 * 9)


@pytest.mark.parametrize("x_shape, w_shape, kwargs", [
    ((32, 64, 4, 4), (64, 64, 3, 3), {"padding": 1}),
    ((8, 32, 8, 8), (48, 32, 3, 3), {"padding": 1}),
    ((5, 16, 3, 3), (24, 16, 3, 3), {"padding": 1}),           # 45 rows: no block of 8 fits
    ((16, 16, 3, 3), (40, 16, 3, 3), {"padding": 1}),          # 40 channels: a partial panel
    ((7, 24, 9, 9), (32, 24, 3, 3), {"stride": 2, "padding": 1}),
    ((4, 32, 6, 6), (32, 32, 3, 3), {}),
])
def test_batch_folded_convs_and_their_input_gradients_match_torch(x_shape, w_shape, kwargs):
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    px = Tensor(x, device="cpu", requires_grad=True)
    out = F.conv2d(px, Tensor(w, device="cpu"), **kwargs)
    g = _data(*out.shape, seed=2)
    (out * Tensor(g, device="cpu")).sum().backward()
    tx = torch.from_numpy(x).double().requires_grad_()
    expected = TF.conv2d(tx, torch.from_numpy(w).double(), **kwargs)
    (expected * torch.from_numpy(g).double()).sum().backward()
    _close(out.numpy(), expected.detach(), int(np.prod(w_shape[1:])))
    _close(px.grad.numpy(), tx.grad, w_shape[0] * 9)
