"""A 1x1 conv (MobileNet's and EfficientNet's expansions and projections) on a device whose
threads are loops: a packed matmul whose n is the output's positions h * w, read as one
axis, so that the register block's lanes and its stores run along them; against torch, with
a prologue, an epilogue, a batch, and a map whose positions end part way into a panel."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from portkit import schedule
from portkit.abi import interpreter
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.nn import functional as F
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor
from tests.codegen.test_conv_tiles import loop_bodies

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
TF = torch.nn.functional


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _item(x: np.ndarray, w: np.ndarray, **kwargs):
    out = F.conv2d(Tensor(x, device="cpu"), Tensor(w, device="cpu"), **kwargs)
    return schedule.create_schedule([out.lazy])[-1]


def test_a_1x1_conv_is_a_matmul_along_the_output_positions():
    # 24 -> 144 channels on 56 x 56 (EfficientNet's first expansion): m was one 56-wide row,
    # each group a 3-row block of it that copied all of B (a group per 3 x 24 x 144 products)
    item = _item(_data(1, 24, 56, 56), _data(144, 24, 1, 1, seed=1))
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the 1x1 conv's sum is not packed"
    contraction, packing = found
    shape = contraction.reduce.src[0].shape
    assert contraction.sizes == (144, 56 * 56, 24)
    assert [shape[a] for a in contraction.n_axes] == [56, 56]
    assert packing.width == 32 and packing.rows * packing.blocks > 3
    kernel = lower(item.root, item.inputs, LOOPS)
    grid = kernel.grid[0]
    assert grid <= 144 * 56 * 56 // (packing.rows * packing.blocks * 32)
    # the multiply-add loop, and every other innermost loop, works out no position by
    # division: the positions are one axis
    bodies = loop_bodies(kernel)
    assert any(Op.MULACC in [n.op for n in body] for body in bodies)
    for body in bodies:
        assert not [n for n in body if n.op in (Op.IDIV, Op.MOD)], "div/mod per element"


def test_a_strided_1x1_conv_keeps_its_rows():
    # stride 2 skips every other input row: the positions are not one axis of the input
    item = _item(_data(1, 16, 16, 16), _data(64, 16, 1, 1, seed=1), stride=2)
    contraction, _ = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.n_fold == ()


def test_a_3x3_conv_keeps_its_orientation():
    # its positions read a padded input whose rows are 2 wider: not one axis; a 3x3 conv's
    # m stays its output rows where a row is no whole number of blocks (40 wide)
    item = _item(_data(1, 16, 40, 40), _data(32, 16, 3, 3, seed=1), padding=1)
    contraction, _ = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.n_fold == () and contraction.sizes == (40 * 40, 32, 144)


def test_a_1x1_conv_runs_in_the_interpreter():
    # 7 x 7 positions: the second panel ends 15 columns short of its width
    x, w = _data(2, 40, 7, 7), _data(48, 40, 1, 1, seed=1)
    item = _item(x, w)
    contraction, _ = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.sizes == (48, 49, 40)
    kernel = lower(item.root, item.inputs, LOOPS)
    by_size = {a.size: a.ravel() for a in (x, w)}
    out = np.zeros(2 * 48 * 49, np.float32)
    interpreter.run(kernel, [out, *(by_size[node.size] for node in item.inputs)])
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double()).numpy()
    np.testing.assert_allclose(out.reshape(expected.shape), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("cin, cout, size, batch, stride", [
    (24, 144, 56, 1, 1), (144, 24, 28, 1, 1), (16, 16, 9, 2, 1), (40, 240, 14, 1, 1),
    (96, 576, 7, 1, 1), (32, 64, 16, 1, 2)])
@pytest.mark.parametrize("fused", [False, True])
def test_1x1_convs_match_torch(cin, cout, size, batch, stride, fused):
    x, w = _data(batch, cin, size, size), _data(cout, cin, 1, 1, seed=1)
    scale, shift = _data(1, cin, 1, 1, seed=2), _data(1, cout, 1, 1, seed=3)
    px, pw = Tensor(x, device="cpu"), Tensor(w, device="cpu")
    tx, tw = torch.from_numpy(x).double(), torch.from_numpy(w).double()
    if fused:
        # an input scaled per channel (a squeeze-excite gate) and an activation after
        px, tx = px * Tensor(scale, device="cpu"), tx * torch.from_numpy(scale).double()
    ours = F.conv2d(px, pw, stride=stride)
    theirs = TF.conv2d(tx, tw, stride=stride)
    if fused:
        ours = (ours + Tensor(shift, device="cpu")).relu()
        theirs = (theirs + torch.from_numpy(shift).double()).relu()
    expected = theirs.numpy()
    bound = 4 * cin * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=bound)
