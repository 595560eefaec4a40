"""A packed conv's depth walk (portkit/codegen/folds.py `taps`): its K = channels x kh x kw is
walked as a loop per channel and tap, so that the multiply-add loop works out no channel or tap
with a division; each conv against torch (float64), with strides, padding, 3 and 64 input
channels and a last depth block of fewer channels."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from portkit import runtime, schedule
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.nn import functional as F
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
TF = torch.nn.functional


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_item(x: np.ndarray, w: np.ndarray, device: str = "cpu", **kwargs):
    """The last scheduled kernel of conv2d(x, w): the sum (a padded copy may come before it)."""
    out = F.conv2d(Tensor(x, device=device), Tensor(w, device=device), **kwargs)
    return schedule.create_schedule([out.lazy])[-1]


def _divisions_in_multiply_add_loops(kernel) -> list[str]:
    """The IDIV and MOD nodes inside an innermost loop that holds a MULACC (the multiply-add
    loop) and that depend on a loop counter: work done per k; those of the group alone are
    loop-invariant."""
    nodes = kernel.nodes
    counted: dict[int, bool] = {}      # node -> whether it depends on a RANGE
    for i, node in enumerate(nodes):
        counted[i] = node.op is Op.RANGE or any(counted.get(s, False) for s in node.src
                                                 if node.op is not Op.END)
    found, stack = [], []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            if stack:
                stack[-1].append(i)
            stack.append([])
        elif node.op is Op.END and stack:
            body = stack.pop()
            innermost = not any(nodes[j].op is Op.RANGE for j in body)
            if innermost and any(nodes[j].op is Op.MULACC for j in body):
                found += [f"{nodes[j].op.name} at node {j}" for j in body
                          if nodes[j].op in (Op.IDIV, Op.MOD) and counted[j]]
            if stack:
                stack[-1] += body + [i]
        elif stack:
            stack[-1].append(i)
    return found


@pytest.mark.parametrize("x_shape, w_shape, kwargs, taps", [
    ((1, 64, 12, 16), (32, 64, 3, 3), {"padding": 1}, (3, 3)),            # K = 576, 4 blocks
    ((1, 64, 16, 16), (32, 64, 3, 3), {"stride": 2, "padding": 1}, (3, 3)),
    ((1, 3, 32, 32), (32, 3, 7, 7), {"stride": 2, "padding": 3}, (7, 7)),   # a ResNet stem
    ((1, 29, 9, 16), (32, 29, 5, 3), {"padding": (2, 1)}, (5, 3)),         # 29 = 15 + 14
])
def test_the_multiply_add_loop_of_a_packed_conv_divides_nothing(x_shape, w_shape, kwargs,
                                                                 taps):
    item = _conv_item(_data(*x_shape), _data(*w_shape, seed=1), **kwargs)
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the conv's sum is not packed"
    assert found[1].taps == taps
    kernel = lower(item.root, item.inputs, LOOPS)
    assert Op.MULACC in [n.op for n in kernel.nodes]
    assert _divisions_in_multiply_add_loops(kernel) == []


def test_a_matmul_and_a_1x1_conv_walk_k_flat():
    x, w = _data(1, 64, 16, 16), _data(32, 64, 1, 1, seed=1)
    item = _conv_item(x, w)
    assert pack.find(item.root, item.inputs, LOOPS)[1].taps == ()
    a, b = Tensor(_data(64, 300), device="cpu"), Tensor(_data(300, 64, seed=1), device="cpu")
    item, = schedule.create_schedule([(a @ b).lazy])
    assert pack.find(item.root, item.inputs, LOOPS)[1].taps == ()


def test_the_depth_blocks_hold_whole_windows_of_a_divisor_of_the_channels():
    item = _conv_item(_data(1, 64, 12, 16), _data(32, 64, 3, 3, seed=1), padding=1)
    packing = pack.find(item.root, item.inputs, LOOPS)[1]
    assert packing.depth % 9 == 0 and 64 % (packing.depth // 9) == 0, packing


def _close(actual: np.ndarray, expected: torch.Tensor, k: int) -> None:
    """Within the gamma_k bound of a float32 dot product of length k (with margin)."""
    expected = expected.numpy()
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound)


CASES = [
    ((1, 64, 10, 12), (40, 64, 3, 3), {"padding": 1}),
    ((2, 64, 14, 14), (32, 64, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 3, 30, 30), (32, 3, 7, 7), {"stride": 2, "padding": 3}),
    ((1, 3, 17, 19), (24, 3, 3, 3), {"padding": 1}),
    ((1, 29, 9, 16), (32, 29, 5, 3), {"padding": (2, 1)}),
    ((1, 67, 7, 7), (48, 67, 3, 3), {"padding": 1}),       # 67 channels: 23, 23 and 21
    ((1, 128, 9, 9), (64, 128, 3, 3), {"stride": 2}),
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs", CASES)
def test_a_conv_walked_by_taps_matches_torch_on_the_cpu(x_shape, w_shape, kwargs):
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    item = _conv_item(x, w, **kwargs)
    assert pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)[1].taps
    out = F.conv2d(Tensor(x, device="cpu"), Tensor(w, device="cpu"), **kwargs).numpy()
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), **kwargs)
    _close(out, expected, int(np.prod(w_shape[1:])))


def test_a_padded_conv_walked_by_taps_computes_in_the_interpreter():
    # the interpreter's schedule keeps the padding inside the kernel: gated loads per tap
    x, w = _data(1, 29, 5, 5), _data(16, 29, 3, 3, seed=1)
    item = _conv_item(x, w, device="interpreter", stride=2, padding=1)
    assert pack.find(item.root, item.inputs, LOOPS)[1].taps == (3, 3)
    kernel = lower(item.root, item.inputs, LOOPS)
    by_size = {x.size: x.ravel(), w.size: w.ravel()}
    inputs = [by_size[int(np.prod(node.shape))] for node in item.inputs]
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(16 * 3 * 3, np.float32), *inputs)
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), stride=2,
                         padding=1)
    _close(out.reshape(1, 16, 3, 3), expected, 29 * 9)


AVX2 = dataclasses.replace(LOOPS, vector_registers=(16, 32))


@pytest.mark.parametrize("size, rows, width", [(28, 2, 32), (14, 2, 32), (7, 7, 8)])
def test_short_rows_walked_by_taps_take_a_block_that_fits_the_registers(size, rows, width):
    # AVX2's twelve accumulator registers hold 3 x 32 float32: a 7-row block narrows to 8
    item = _conv_item(_data(1, 64, size, size), _data(64, 64, 3, 3, seed=1), padding=1)
    packing = pack.find(item.root, item.inputs, AVX2)[1]
    assert (packing.rows, packing.width) == (rows, width), packing
