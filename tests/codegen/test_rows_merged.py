"""Short rows merged into one (codegen/rows.py `merged`): an elementwise kernel on a 7 x 7 map
whose loads run on from row to row loops over the map's 49 positions per channel, with no
division in the loop; gated, permuted and reduced kernels keep their rows; against numpy."""
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


def _floats(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _innermost(kernel) -> list[tuple[int, list]]:
    """(trip count, nodes) of each innermost loop whose end is a constant."""
    nodes, found, stack = kernel.nodes, [], []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            if stack:
                stack[-1][1].append(node)
            stack.append((i, []))
        elif node.op is Op.END and stack:
            start, body = stack.pop()
            end = nodes[nodes[start].src[1]]
            if not any(n.op is Op.RANGE for n in body) and end.op is Op.CONST:
                found.append((end.arg, body))
            if stack:
                stack[-1][1].extend(body + [node])
        elif stack:
            stack[-1][1].append(node)
    return found


def _silu_gate(x: np.ndarray, bias: np.ndarray, gate: np.ndarray):
    px = Tensor(x, device="cpu") + Tensor(bias, device="cpu")
    ours = px * px.sigmoid() * Tensor(gate, device="cpu")
    h = x.astype(np.float64) + bias
    return ours, h / (1 + np.exp(-h)) * gate


def test_a_7x7_map_is_one_row_of_49_without_division():
    x, bias, gate = _floats(1, 24, 7, 7), _floats(1, 24, 1, 1, seed=1), _floats(1, 24, 1, 1,
                                                                                  seed=2)
    ours, _ = _silu_gate(x, bias, gate)
    item, = schedule.create_schedule([ours.lazy])
    loops = _innermost(lower(item.root, item.inputs, LOOPS))
    assert [trips for trips, _ in loops] == [49], "the map is not one row of 49"
    for _, body in loops:
        assert not [n for n in body if n.op in (Op.IDIV, Op.MOD)], "div/mod per element"


def test_a_padded_copy_keeps_its_rows():
    x = _floats(1, 8, 7, 7)
    out = Tensor(x, device="cpu").pad(((0, 0), (0, 0), (1, 1), (1, 1))) * 2
    item, = schedule.create_schedule([out.lazy])
    assert 81 not in [trips for trips, _ in _innermost(lower(item.root, item.inputs, LOOPS))]
    np.testing.assert_allclose(out.numpy(), np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))) * 2)


def test_a_transposed_map_keeps_its_rows():
    x = _floats(1, 8, 7, 7)
    out = Tensor(x, device="cpu").permute(0, 1, 3, 2) + 1
    item, = schedule.create_schedule([out.lazy])
    assert 49 not in [trips for trips, _ in _innermost(lower(item.root, item.inputs, LOOPS))]
    np.testing.assert_allclose(out.numpy(), x.transpose(0, 1, 3, 2) + 1)


@pytest.mark.parametrize("shape", [(1, 672, 7, 7), (2, 40, 14, 14), (3, 5, 6), (1, 16, 28, 28),
                                   (4, 3, 2, 5)])
def test_merged_rows_match_numpy(shape):
    per_channel = (*shape[:2], *(1,) * (len(shape) - 2))
    x, bias, gate = _floats(*shape), _floats(*per_channel, seed=1), _floats(*per_channel, seed=2)
    ours, expected = _silu_gate(x, bias, gate)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-5, atol=1e-6)
    # a sum over the map after it: its own kernel keeps its rows
    total = ours.sum(axis=-1)
    np.testing.assert_allclose(total.numpy(), expected.sum(axis=-1), rtol=1e-4, atol=1e-4)


def test_fills_of_short_rows_keep_their_values():
    # a fill's value is a kernel argument; merging its rows made it a constant in the code,
    # and every later fill of that shape gave the first one's value (a sum over an empty axis
    # gave a product's 1)
    for value in (1.0, 2.0, -3.5):
        np.testing.assert_array_equal(Tensor.full((3, 1, 5), value, device="cpu").numpy(),
                                      np.full((3, 1, 5), value, np.float32))
    empty = Tensor(np.zeros((2, 0, 4), np.float32), device="cpu")
    np.testing.assert_array_equal(empty.prod(1, keepdim=True).numpy(), np.ones((2, 1, 4)))
    np.testing.assert_array_equal(empty.sum(1, keepdim=True).numpy(), np.zeros((2, 1, 4)))


@pytest.mark.parametrize("shape, row", [((512, 512, 3, 3), 576), ((64, 200, 3, 3), 900)])
def test_a_conv_weights_update_runs_in_rows_of_whole_windows(shape, row):
    # 512 x 3 x 3 is past MERGED_ROW: cut into rows of a divisor of it that holds whole 3 x 3
    # windows, not left in rows of 9
    w, g = _floats(*shape), _floats(*shape, seed=1)
    ours = Tensor(w, device="cpu") - Tensor(g, device="cpu") * 0.1
    item, = schedule.create_schedule([ours.lazy])
    loops = _innermost(lower(item.root, item.inputs, LOOPS))
    assert [trips for trips, _ in loops] == [row]
    for _, body in loops:
        assert not [n for n in body if n.op in (Op.IDIV, Op.MOD)], "div/mod per element"
    np.testing.assert_array_equal(ours.numpy(), w - g * np.float32(0.1))


def test_a_row_whose_steps_take_the_short_trailing_axes_is_counted_once():
    # a 2x2 pool's blocks, (2, 4, 8, 2, 16, 2, 1): rows of 16 whose steps take the trailing
    # (2, 1) whole; the thread loop counts 2 * 4 * 8 * 2 rows, not twice as many (which ran
    # and stored every row twice)
    x = Tensor(_floats(2, 4, 8, 2, 16, 2), device="cpu")
    items = schedule.create_schedule([(x * 2).unsqueeze(-1).sum(-1).lazy])
    item, = (it for it in items if it.root.shape == (2, 4, 8, 2, 16, 2, 1))
    kernel = lower(item.root, item.inputs, LOOPS)
    nodes = kernel.nodes
    thread = next(n for n in nodes if n.op is Op.RANGE)
    end = nodes[thread.src[1]]
    assert end.op is Op.WHERE and nodes[end.src[2]].arg == 2 * 4 * 8 * 2
