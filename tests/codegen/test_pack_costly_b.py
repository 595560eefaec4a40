"""A packed contraction whose B panel costs more to copy than its multiply-adds (a projection
1x1 conv after a squeeze-excite block, whose input is hardswish(x + b) times the gate, or a
1x1 conv whose positions end part way into a panel, each element gated): each group takes
all of m's blocks, so B is copied into the panel once per panel, not once per group along m."""
from __future__ import annotations

from math import ceil

import numpy as np
import pytest
import torch

from portkit import schedule
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.nn import functional as F
from portkit.tensor import Tensor
from tests.codegen.test_pack_pointwise import LOOPS, TF, _data

# MobileNetV3-small's 240 -> 40 on 14 x 14 (K in one depth block) and 576 -> 96 on 7 x 7 (three)
SHAPES = [(240, 40, 14), (576, 96, 7)]


def _projection(cin: int, cout: int, size: int, gated: bool = True):
    """The conv of hardswish(x + b) * gate (or of x) as ours and as torch's, in float64."""
    x, w = _data(1, cin, size, size), _data(cout, cin, 1, 1, seed=1)
    shift, gate = _data(1, cin, 1, 1, seed=2), _data(1, cin, 1, 1, seed=3)
    ours, theirs = Tensor(x, device="cpu"), torch.from_numpy(x).double()
    if gated:
        ours = F.hardswish(ours + Tensor(shift, device="cpu")) * Tensor(gate, device="cpu")
        theirs = TF.hardswish(theirs + torch.from_numpy(shift).double()) * torch.from_numpy(
            gate).double()
    return (F.conv2d(ours, Tensor(w, device="cpu")),
            TF.conv2d(theirs, torch.from_numpy(w).double()))


def _packing(cin: int, cout: int, size: int, gated: bool = True):
    ours, _ = _projection(cin, cout, size, gated)
    item = schedule.create_schedule([ours.lazy])[-1]
    contraction, packing = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.sizes == (cout, size * size, cin)
    return packing, lower(item.root, item.inputs, LOOPS)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("cin, cout, size", SHAPES)
def test_a_costly_b_is_evaluated_once_per_panel(cin, cout, size, gated):
    packing, kernel = _packing(cin, cout, size, gated)
    times = ceil(cout / (packing.rows * packing.blocks))
    assert times == 1, f"B evaluated {times} times per panel"
    # a group per panel, panels narrowed to keep more groups than 7 x 7's two 32-wide ones
    assert kernel.grid[0] == ceil(size * size / packing.width)
    assert packing.width == 16


def test_a_loaded_b_that_fills_its_panels_keeps_its_packing():
    # 16 x 16 positions, 8 whole panels: the copy is ungated, and 40 groups of one block
    packing, _ = _packing(240, 40, 16, gated=False)
    assert (packing.width, packing.blocks) == (32, 1)


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("cin, cout, size", [*SHAPES, (240, 80, 14), (480, 112, 14)])
def test_a_projection_matches_torch(cin, cout, size, gated):
    ours, theirs = _projection(cin, cout, size, gated)
    expected = theirs.numpy()
    bound = 4 * cin * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=bound)
