"""A concatenation on a device whose threads are loops runs one plain loop per row for the one
piece the row lies in (portkit/codegen/cases.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor
from portkit.tensor.movement import cat, stack
from tests.codegen.test_conv_tiles import loop_bodies

SERIAL_CAPS = dataclasses.replace(capabilities(), threads_are_loops=True)


def _cache(device: str, layers=3, heads=2, length=5, size=16, seed=0):
    """A decode step's key/value cache: per layer, the past keys and values each joined with
    the new position's, stacked by kind and by layer (as GPT-2 builds it)."""
    rng = np.random.default_rng(seed)
    past = rng.standard_normal((layers, 2, heads, length, size), np.float32)
    new = rng.standard_normal((layers, 2, heads, 1, size), np.float32)
    p, n = Tensor(past, device=device), Tensor(new, device=device)
    out = stack([stack([cat([p[layer, kind], n[layer, kind] * 2], 1) for kind in range(2)])
                 for layer in range(layers)])
    expected = np.concatenate([past, new * 2], 3)
    return out, expected


def test_a_joined_cache_copies_each_piece_in_a_loop_without_gates():
    out, expected = _cache("cpu")
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, SERIAL_CAPS)
    bodies = loop_bodies(kernel)
    # 3 layers x 2 kinds x (the past, the new position): one loop each, storing one value
    # read by one ungated load (a sum of gated loads read every piece at every element)
    assert len(bodies) == 12, len(bodies)
    for body in bodies:
        loads = [n for n in body if n.op is Op.LOAD]
        assert len(loads) == 1 and len(loads[0].src) == 2, loads
        assert not [n for n in body if n.op in (Op.WHERE, Op.IDIV, Op.MOD)]
        assert [n.op for n in body].count(Op.STORE) == 1
    # nested tests: one per layer, per kind inside it, per piece inside that
    assert [n.op for n in kernel.nodes].count(Op.IF) == 3 + 6 + 12
    np.testing.assert_array_equal(out.numpy(), expected)


def test_a_joined_cache_matches_on_the_interpreter():
    out, expected = _cache("interpreter", layers=2, length=9)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("case", ["overlap", "gap", "column", "bool"])
def test_sums_of_padded_pieces_that_are_not_a_join_keep_their_sum(case):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((6, 16), np.float32) for _ in range(2))
    ta, tb = Tensor(a, device="cpu"), Tensor(b, device="cpu")
    if case == "overlap":      # rows 2..5 lie in both pieces
        out = ta.pad(((0, 2), (0, 0))) + tb.pad(((2, 0), (0, 0)))
        expected = np.pad(a, ((0, 2), (0, 0))) + np.pad(b, ((2, 0), (0, 0)))
    elif case == "gap":        # rows 6..7 lie in no piece: zeros
        out = ta.pad(((0, 8), (0, 0))) + tb.pad(((8, 0), (0, 0)))
        expected = np.concatenate([a, np.zeros((2, 16), np.float32), b])
    elif case == "column":     # joined along the row's own axis: the gate moves along it
        out, expected = cat([ta, tb], 1), np.concatenate([a, b], 1)
    else:
        out = cat([ta > 0, tb > 0], 0)
        expected = np.concatenate([a > 0, b > 0], 0)
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, SERIAL_CAPS)
    ifs = [n.op for n in kernel.nodes].count(Op.IF)
    sums = [n for n in kernel.nodes if n.op is Op.ADD and n.dtype == dtypes.float32]
    if case == "bool":
        assert ifs == 2, ifs
    elif case == "column":
        assert ifs == 0 and sums, (ifs, len(sums))
    else:       # the pieces' sum stays (their padded rows' gates may be tested once per row)
        assert sums
    np.testing.assert_array_equal(out.numpy(), expected)


def test_pieces_side_by_side_along_a_row_run_one_loop_each():
    # the gradient of chunk(4, -1) (an LSTM's gates): four padded pieces along the row's own
    # axis; each loop computes one piece, ungated, where one loop computed all four per column
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((16, 40), np.float32) for _ in range(4)]
    ts = [Tensor(p, device="cpu") for p in parts]
    out = cat([ts[0].sigmoid(), ts[1] * ts[2], ts[2].tanh(), ts[3].exp()], 1)
    item, = schedule.create_schedule([out.lazy])
    bodies = loop_bodies(lower(item.root, item.inputs, SERIAL_CAPS))
    assert len(bodies) == 4, len(bodies)
    for body in bodies:
        loads = [n for n in body if n.op is Op.LOAD]
        assert 1 <= len(loads) <= 2 and all(len(n.src) == 2 for n in loads), loads
        assert [n.op for n in body].count(Op.BITCAST) <= 2     # one exponential's 2^k
    expected = np.concatenate([1 / (1 + np.exp(-parts[0])), parts[1] * parts[2],
                               np.tanh(parts[2]), np.exp(parts[3])], 1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
