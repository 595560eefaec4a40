"""Matmuls with few rows (M = 1..32: an LSTM step's batch, decode's one token) against numpy,
forward and as both gradient products, and how a packed kernel copies a B that steps by 1
along k (x @ W.T) into its panel."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import schedule
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
RNG = np.random.default_rng(0)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _innermost_range_at_panel_store(kernel) -> int:
    """The trip count of the innermost loop around the first store into LOCAL memory of a value
    loaded from a buffer, or of a product of such (the panel copy's; the running sums are
    stored zeros first)."""
    nodes = kernel.nodes
    locals_ = {i for i, n in enumerate(nodes) if n.op is Op.LOCAL}
    open_ranges: list[int] = []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            open_ranges.append(i)
        elif node.op is Op.END and node.src and node.src[0] in open_ranges:
            open_ranges.remove(node.src[0])
        elif (node.op is Op.STORE and node.src[0] in locals_
              and nodes[node.src[2]].op in (Op.LOAD, Op.MUL)):
            end = nodes[nodes[open_ranges[-1]].src[1]]
            assert end.op is Op.CONST, end
            return end.arg
    raise AssertionError("no store into LOCAL")


def test_a_panel_of_w_transposed_whose_rows_crowd_an_l1_set_is_copied_along_k_innermost():
    # W is [n][k]: the copy reads each of the panel's 32 rows along k, not 32 rows K apart at
    # each k (4 KiB apart for K = 1024, which evict each other from one L1 set; 2 KiB apart
    # for K = 512, 16 rows in each of two 8-way sets)
    for rows, depth in ((16, 1024), (64, 512)):
        a, w = Tensor(_floats(rows, depth), device="interpreter"), Tensor(
            _floats(256, depth), device="interpreter")
        item, = schedule.create_schedule([(a @ w.T).lazy])
        kernel = lower(item.root, item.inputs, LOOPS)
        assert Op.LOCAL in [n.op for n in kernel.nodes]
        assert _innermost_range_at_panel_store(kernel) == 256    # the depth block, not 32
    x = Tensor(_floats(16, 1024), device="interpreter")
    item, = schedule.create_schedule([(x @ Tensor(_floats(1024, 256),
                                                  device="interpreter")).lazy])
    # W is [k][n]: read along n innermost, as it lies
    assert _innermost_range_at_panel_store(lower(item.root, item.inputs, LOOPS)) == 32
    # rows 3 KiB apart fall in different L1 sets: the copy whose stores are contiguous (20
    # rows: 16 or fewer trade places with W's, folds.few_rows, and the panel is x's)
    x, w = Tensor(_floats(20, 768), device="interpreter"), Tensor(_floats(256, 768),
                                                                 device="interpreter")
    item, = schedule.create_schedule([(x @ w.T).lazy])
    assert _innermost_range_at_panel_store(lower(item.root, item.inputs, LOOPS)) == 32


def test_a_gated_1x1_conv_copies_its_panel_along_the_positions_innermost():
    # EfficientNet's projection: x * gate[c] into a 1x1 conv 96 -> 24 on 56 x 56. The gate
    # steps by 1 along k (the channels), x by one element along n: its 32 columns are two cache
    # lines, not 32 rows that crowd an L1 set, so the copy runs along them (k innermost it read
    # x 12 KiB apart at each step and stayed scalar: the conv at 21 GFLOP/s, one thread)
    x, gate = _floats(1, 96, 56, 56), _floats(1, 96, 1, 1)
    w = _floats(24, 96, 1, 1)
    out = (Tensor(x, device="interpreter") * Tensor(gate, device="interpreter")).conv2d(
        Tensor(w, device="interpreter"))
    item, = schedule.create_schedule([out.lazy])
    assert _innermost_range_at_panel_store(lower(item.root, item.inputs, LOOPS)) == 32


PRODUCTS = {
    "x @ w": lambda x, w, wt, dy: (x @ w, None),
    "x @ wt.T": lambda x, w, wt, dy: (x @ wt.T, None),
    "dy @ w.T": lambda x, w, wt, dy: (dy @ w.T, None),
    "x.T @ dy": lambda x, w, wt, dy: (x.T @ dy, None),
}


@pytest.mark.parametrize("k, n", [(256, 1024), (1024, 256), (768, 3072), (3072, 768)])
@pytest.mark.parametrize("m", [1, 4, 16, 32])
@pytest.mark.parametrize("product", list(PRODUCTS))
def test_small_m_matmuls_match_numpy(product, m, k, n):
    arrays = _floats(m, k), _floats(k, n), _floats(n, k), _floats(m, n)
    actual, _ = PRODUCTS[product](*(Tensor(a, device="cpu") for a in arrays))
    expected, _ = PRODUCTS[product](*(a.astype(np.float64) for a in arrays))
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-4,
                               atol=1e-4 * np.abs(expected).max(),
                               err_msg=f"{product} with m={m}, k={k}, n={n}")
