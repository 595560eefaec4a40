"""Convolution on a device whose threads are loops: a padded copy, gate-free vector lanes, and
index math without a per-load `% 58` (portkit/codegen/pads.py, portkit/symbolic.py, `plan`)."""
from __future__ import annotations

import dataclasses
from itertools import product

import numpy as np
import pytest
import torch

from portkit import schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.plan import SERIAL, THREADED, plan
from portkit.nn import functional as F
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.symbolic import Div, Mod, var
from portkit.tensor import Tensor

CAPABILITIES = capabilities()

SERIAL_CAPS = dataclasses.replace(CAPABILITIES, threads_are_loops=True)


def _conv(device: str, n=2, c=16, size=12, seed=0):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((n, c, size, size), np.float32), rng.standard_normal(
        (c, c, 3, 3), np.float32)
    out = Tensor(x, device=device).conv2d(Tensor(w, device=device), padding=1)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)
    return out, expected.numpy()


def _atoms(expr) -> list:
    return [a for a, _ in expr.terms if isinstance(a, (Div, Mod))]


@pytest.mark.parametrize("divisor, coef", [(58, 59), (12, 13), (58, 57)])
def test_a_window_index_folds_its_modulo_away(divisor, coef):
    # a padded window's column: (x + coef*k) % divisor with x + k inside one row
    x, k = var("x", 0, divisor - 4), var("k", 0, 2)
    shift = 2 if coef < divisor else 0      # coef = -1 (mod divisor): x - k + 2 >= 0
    expr = x + k * coef + shift
    assert not _atoms(expr % divisor) and not _atoms(expr // divisor)
    for xv, kv in product(range(divisor - 3), range(3)):
        flat = xv + coef * kv + shift
        env = {"x": xv, "k": kv}
        assert _value(expr % divisor, env) == flat % divisor
        assert _value(expr // divisor, env) == flat // divisor


def test_a_lane_of_an_aligned_tile_divides_like_its_tile():
    # (8*m + lane) // 56 is m // 7 and (3136*a + b) // 25088 is a // 8 when b < 3136
    m, a, b = var("m", 0, 391), var("a", 0, 63), var("b", 0, 3135)
    for expr, divisor in ((m * 8 + 3, 56), (a * 3136 + b, 25088)):
        quotient, rest = expr // divisor, expr % divisor
        assert [x.divisor for x in _atoms(quotient)] in ([7], [8]), quotient
        for mv, av, bv in ((0, 0, 0), (391, 63, 3135), (55, 17, 1000), (6, 8, 3135)):
            env = {"m": mv, "a": av, "b": bv}
            flat = _value(expr, env)
            assert (_value(quotient, env), _value(rest, env)) == divmod(flat, divisor)


def _value(expr, env) -> int:
    total = expr.const
    for atom, coef in expr.terms:
        if isinstance(atom, Div):
            value = _value(atom.expr, env) // atom.divisor
        elif isinstance(atom, Mod):
            value = _value(atom.expr, env) % atom.divisor
        else:
            value = env[atom.name]
        total += coef * value
    return total


def test_each_padded_input_is_loaded_once_for_all_output_channels():
    out, _ = _conv("interpreter")
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, CAPABILITIES)
    loads = [n for n in kernel.nodes if n.op is Op.LOAD]
    gated = [tuple(n.src[:2]) for n in loads if len(n.src) == 3]
    assert gated and len(gated) == len(set(gated)), "a gated load is emitted twice"


def test_a_serial_device_copies_the_padded_input_and_reads_it_without_gates():
    out, expected = _conv("cpu")
    items = schedule.create_schedule([out.lazy])
    assert len(items) == 2, "the padded input is its own kernel"
    kernel = lower(items[-1].root, items[-1].inputs, SERIAL_CAPS)
    assert not [n for n in kernel.nodes if n.op is Op.LOAD and len(n.src) == 3]
    assert not [n for n in kernel.nodes if n.op is Op.MOD and kernel.nodes[n.src[1]].arg == 14]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_a_padded_max_pool_reads_its_filled_copy_without_gates():
    # a ResNet stem's pool: relu(x + b) padded with -inf, 3 x 3 windows at stride 2; read gated,
    # each of the nine terms decoded its element and recomputed the bias and the ReLU
    rng = np.random.default_rng(5)
    x, b = rng.standard_normal((1, 8, 18, 18), np.float32), rng.standard_normal(
        (1, 8, 1, 1), np.float32)
    out = (Tensor(x, device="cpu") + Tensor(b, device="cpu")).relu().max_pool2d(3, 2, 1)
    items = schedule.create_schedule([out.lazy])
    assert len(items) == 2, "the filled, padded input is its own kernel"
    kernel = lower(items[-1].root, items[-1].inputs, SERIAL_CAPS)
    assert not [n for n in kernel.nodes if n.op is Op.LOAD and len(n.src) == 3]
    assert not [n for n in kernel.nodes if n.op in (Op.ADD, Op.CMPLT)
                and kernel.nodes[n.src[0]].op is Op.LOAD], "the pool recomputes relu(x + b)"
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(x + b).relu(), 3, 2, 1)
    np.testing.assert_array_equal(out.numpy(), expected.numpy())


def test_a_threaded_device_keeps_one_kernel():
    out, expected = _conv("interpreter", n=1, c=4, size=6)
    assert len(schedule.create_schedule([out.lazy])) == 1
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_the_padded_copy_replays_with_new_inputs():
    # a second graph of the same structure replays the first one's steps (schedule/runner.py)
    for seed in (1, 2, 3):
        out, expected = _conv("cpu", n=1, c=8, size=10, seed=seed)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_conv_backward_matches_torch_on_the_cpu():
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 8, 9, 9), np.float32), rng.standard_normal(
        (8, 8, 3, 3), np.float32)
    px, pw = Tensor(x, device="cpu", requires_grad=True), Tensor(w, device="cpu",
                                                                requires_grad=True)
    px.conv2d(pw, padding=1).sum().backward()
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(tx, tw, padding=1).sum().backward()
    np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_conv_tiles_take_the_row_as_lanes_and_channels_as_reuse():
    out, _ = _conv("cpu", n=2, c=16, size=16)
    conv = schedule.create_schedule([out.lazy])[-1]
    tiles = dict(plan(conv.root, conv.inputs, SERIAL).upcast)
    assert tiles.get(3, 1) > 1 and tiles.get(1, 1) > 1 and 2 not in tiles, tiles


def test_a_vectorizing_device_takes_no_lanes_along_a_padding_gate():
    # without the copy (a threaded device's schedule), the row axis is gated by the padding
    out, _ = _conv("interpreter", n=2, c=16, size=16)
    item, = schedule.create_schedule([out.lazy])
    assert {2, 3} & dict(plan(item.root, item.inputs, SERIAL).upcast).keys() == set()
    assert 3 in dict(plan(item.root, item.inputs, THREADED).upcast)


def loop_bodies(kernel):
    """The nodes of each innermost loop (RANGE to its END)."""
    bodies, stack = [], []
    for node in kernel.nodes:
        if node.op is Op.RANGE:
            if stack:
                stack[-1].append(node)
            stack.append([])
        elif node.op is Op.END and stack:
            body = stack.pop()
            if not any(n.op is Op.RANGE for n in body):
                bodies.append(body)
            if stack:
                stack[-1] += body + [node]
        elif stack:
            stack[-1].append(node)
    return bodies


@pytest.mark.parametrize("move", ["pad", "permute"])
def test_a_serial_device_decodes_positions_once_per_row(move):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 10, 12), np.float32)
    px = Tensor(x, device="cpu")
    if move == "pad":
        out, expected = px.pad(((0, 0), (1, 1), (2, 2))) + 1, np.pad(x, ((0, 0), (1, 1), (2, 2))) + 1
    else:
        out, expected = px.permute(0, 2, 1) * 2, x.transpose(0, 2, 1) * 2
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, SERIAL_CAPS)
    for inner in loop_bodies(kernel):
        assert not [n for n in inner if n.op in (Op.IDIV, Op.MOD)], "div/mod per element"
    np.testing.assert_allclose(out.numpy(), expected)


def test_a_padded_copy_of_a_small_map_decodes_positions_once_per_row():
    # a 4 x 4 map padded to 6 x 6 (ResNet's last stage): rows of 6 columns, shorter than an
    # unpadded row needs to loop, still loop, and its elements pay no div or mod
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 4, 4), np.float32)
    out = Tensor(x, device="cpu").pad(((0, 0), (0, 0), (1, 1), (1, 1))) * 2
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, SERIAL_CAPS)
    for inner in loop_bodies(kernel):
        assert not [n for n in inner if n.op in (Op.IDIV, Op.MOD)], "div/mod per element"
    np.testing.assert_array_equal(out.numpy(), np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))) * 2)


def test_eight_lane_tiles_keep_to_the_vector_registers():
    # rows of 24 columns make 8 lanes, half a 16-lane register: the channels take half the
    # accumulators (16, not 32 x 8 = 32 registers' worth, which spilled a third of them)
    out, _ = _conv("cpu", n=1, c=64, size=24)
    conv = schedule.create_schedule([out.lazy])[-1]
    tiles = dict(plan(conv.root, conv.inputs, SERIAL).upcast)
    assert tiles[3] == 8 and tiles[1] * tiles[3] == SERIAL.accumulators // 2, tiles


def _gate_compares(kernel) -> list:
    """The CMPLT nodes that a LOAD's gate or an IF is made of (through ANDs)."""
    stack = [n.src[2] for n in kernel.nodes if n.op is Op.LOAD and len(n.src) == 3]
    stack += [n.src[0] for n in kernel.nodes if n.op is Op.IF]
    found: dict[int, object] = {}
    while stack:
        i = stack.pop()
        node = kernel.nodes[i]
        if node.op is Op.AND:
            stack += node.src
        elif node.op is Op.CMPLT:
            found[i] = node
    return list(found.values())


def test_a_two_sided_padding_gate_is_one_unsigned_compare():
    # 0 <= column - 1 < 12 as (uint32)(column - 1) < 12: clang turned the two signed compares
    # into a switch on the column and left a padded row's copy scalar (half speed)
    px = Tensor(np.arange(3 * 10 * 12, dtype=np.float32).reshape(3, 10, 12), device="cpu")
    out = px.pad(((0, 0), (1, 1), (1, 1)))
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, SERIAL_CAPS)
    compares = _gate_compares(kernel)
    assert compares and all(kernel.nodes[n.src[0]].dtype == dtypes.uint32 for n in compares)
    # a device without uint32 keeps two signed compares per bound
    signed = dataclasses.replace(SERIAL_CAPS, dtypes=SERIAL_CAPS.dtypes - {dtypes.uint32})
    kernel = lower(item.root, item.inputs, signed)
    assert len(_gate_compares(kernel)) == 2 * len(compares)
    assert all(kernel.nodes[n.src[0]].dtype == dtypes.int32 for n in _gate_compares(kernel))
    np.testing.assert_array_equal(out.numpy(), np.pad(px.numpy(), ((0, 0), (1, 1), (1, 1))))


def test_a_padded_copy_loads_without_gates_inside_the_padding():
    # EfficientNet's copy of bias + SiLU into a zero-padded map: a gate per element (column and
    # row) kept clang from vectorizing the row (18 ms for 96 x 114 x 114, 5.6 ms split). The
    # row's gate is one IF around its loops, and the loop over the columns inside the padding
    # has no gate; the padding columns and rows store zeros.
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 12, 12), np.float32)
    bias = rng.standard_normal((1, 4, 1, 1), np.float32)
    w = rng.standard_normal((4, 1, 3, 3), np.float32)
    out = F.conv2d((Tensor(x, device="cpu") + Tensor(bias, device="cpu")).silu(),
                   Tensor(w, device="cpu"), padding=1, groups=4)
    copy = schedule.create_schedule([out.lazy])[0]
    assert copy.root.size == 4 * 14 * 14
    kernel = lower(copy.root, copy.inputs, SERIAL_CAPS)
    assert not [n for n in kernel.nodes if n.op is Op.LOAD and len(n.src) == 3], "gated load"
    computed = [body for body in loop_bodies(kernel) if any(n.op is Op.LOAD for n in body)]
    columns = [tuple(kernel.nodes[i].arg for i in n.src) for n in kernel.nodes
               if n.op is Op.RANGE][1:]
    assert len(computed) == 1 and columns == [(0, 1), (1, 13), (13, 14), (0, 14)], columns
    assert [n.op for n in kernel.nodes].count(Op.IF) == 2
    silu = torch.nn.functional.silu(torch.from_numpy(x + bias))
    expected = torch.nn.functional.conv2d(silu, torch.from_numpy(w), padding=1, groups=4)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
