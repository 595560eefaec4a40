"""A packed 3x3 conv whose output row fills whole register blocks (32-wide maps, codegen/folds.py
`flatten`) takes that row as n: lanes and stores along the row, the weights read in place as A;
one whose row does not (56 wide) folds rows into m until a group holds many register blocks
(codegen/pack.py `find`); each conv against torch (float64)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from portkit.codegen import pack
from portkit.nn import functional as F
from portkit.tensor import Tensor
from tests.codegen.test_conv_taps import LOOPS, TF, _close, _conv_item, _data


def _packed(x_shape, w_shape, **kwargs):
    item = _conv_item(_data(*x_shape), _data(*w_shape, seed=1), **kwargs)
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the conv's sum is not packed"
    return item, found


@pytest.mark.parametrize("x_shape, w_shape", [
    ((2, 32, 32, 32), (64, 32, 3, 3)),      # the CIFAR CNN's second conv
    ((1, 16, 8, 64), (32, 16, 3, 3)),       # a 64-wide row: two panels
])
def test_a_32_wide_row_is_n_and_the_output_channels_are_m(x_shape, w_shape):
    _, (found, packing) = _packed(x_shape, w_shape, padding=1)
    shape = found.reduce.src[0].shape
    output_axes = [a for a, size in enumerate(shape) if size > 1 and a not in found.k_axes]
    assert found.n_axes == (output_axes[-1],), "the lanes do not run along the output row"
    assert found.sizes[:2] == (w_shape[0], x_shape[-1])
    assert packing.taps == (3, 3)


def test_a_16_wide_map_keeps_its_positions_as_m():
    _, (found, packing) = _packed((2, 64, 16, 16), (128, 64, 3, 3), padding=1)
    assert found.sizes[:2] == (256, 128) and packing.taps == (3, 3)


def test_a_40_wide_row_folds_into_m_for_a_group_of_several_rows():
    _, (found, packing) = _packed((4, 32, 8, 40), (32, 32, 3, 3), padding=1)
    assert found.sizes[:2] == (320, 32), "the output rows are not folded into m"
    assert packing.rows * packing.blocks > 40, packing


@pytest.mark.parametrize("x_shape, w_shape, kwargs", [
    ((1, 16, 8, 40), (32, 16, 3, 3), {"padding": 1}),
    ((2, 32, 32, 32), (64, 32, 3, 3), {"padding": 1}),
    ((1, 24, 6, 64), (40, 24, 3, 3), {"padding": 1}),      # 40 channels: a remainder block
    ((1, 16, 10, 66), (32, 16, 3, 3), {}),                   # unpadded: 64 outputs a row
    ((1, 8, 8, 64), (16, 8, 3, 3), {"stride": 2, "padding": 1}),
])
def test_a_conv_along_its_output_row_matches_torch_on_the_cpu(x_shape, w_shape, kwargs):
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    out = F.conv2d(Tensor(x, device="cpu"), Tensor(w, device="cpu"), **kwargs).numpy()
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), **kwargs)
    _close(out, expected, int(np.prod(w_shape[1:])))
