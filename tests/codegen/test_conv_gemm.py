"""Convolution as an implicit GEMM (portkit/tensor/spatial.py `_correlate`): the window's (channel,
*kernel) axes are read as one axis K, so on a device whose threads are loops the conv's sum is
lowered as a packed matmul (portkit/codegen/pack.py): M along the output row, N the output
channels, A read through the windows in place. Each check is against torch (float64), at odd
sizes, strides, padding, dilation, groups and float16, forward and backward."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from portkit import runtime, schedule
from portkit.abi import interpreter
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.graph import GraphOp
from portkit.nn import functional as F
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor, float16

CAPABILITIES = capabilities()

TF = torch.nn.functional
LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_item(x: np.ndarray, w: np.ndarray, device: str = "cpu", **kwargs):
    """The last scheduled kernel of conv(x, w): the sum (a padded copy may come before it)."""
    d = x.ndim - 2
    out = getattr(F, f"conv{d}d")(Tensor(x, device=device), Tensor(w, device=device), **kwargs)
    return schedule.create_schedule([out.lazy])[-1]


def _close(actual, expected: torch.Tensor, k: int, rtol: float = 0.0) -> None:
    """Within the gamma_k bound of a float32 dot product of length k (with margin)."""
    expected = expected.detach().numpy()
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=rtol, atol=bound)


def test_a_conv_on_a_device_whose_threads_are_loops_is_a_packed_matmul():
    item = _conv_item(_data(2, 16, 12, 16), _data(32, 16, 3, 3, seed=1), padding=1)
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the conv's sum is not seen as a matmul"
    contraction, _ = found
    shape = contraction.reduce.src[0].shape
    # M runs along the output row (and, the row being under 32 wide, over the 12 rows and,
    # those being few, the 2 images), N over the output channels, K over 16 channels x 3 x 3
    assert contraction.sizes == (2 * 12 * 16, 32, 16 * 9) and shape[contraction.m] == 16
    ops = [n.op for n in lower(item.root, item.inputs, LOOPS).nodes]
    assert Op.LOCAL in ops and Op.MULACC in ops


def test_the_packed_conv_computes_in_the_interpreter():
    x, w = _data(1, 16, 9, 24), _data(16, 16, 3, 3, seed=1)
    item = _conv_item(x, w, device="interpreter", padding=1)
    assert pack.find(item.root, item.inputs, LOOPS) is not None
    kernel = lower(item.root, item.inputs, LOOPS)
    # the interpreter's schedule keeps the padding inside the one kernel (gated loads)
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(16 * 9 * 24, np.float32),
                                             *(_inputs(item, x, w)))
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
    _close(torch.from_numpy(out.reshape(1, 16, 9, 24)), expected, 144)


def _inputs(item, x: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """The kernel's inputs in PARAM order: the input and the weight, by shape."""
    by_size = {x.size: x.ravel(), w.size: w.ravel()}
    return [by_size[int(np.prod(node.shape))] for node in item.inputs]


# (x shape, w shape, kwargs): odd sizes, strides 1 and 2, padding, dilation, groups, 1-d and
# 3-d; each large enough (M x N x K) to be packed on the CPU where N >= 16
CASES = [
    ((2, 16, 13, 19), (32, 16, 3, 3), {"padding": 1}),
    ((1, 24, 15, 17), (16, 24, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 8, 11, 21), (24, 8, 3, 3), {"padding": 2, "dilation": 2}),
    ((1, 32, 9, 23), (64, 16, 3, 3), {"padding": 1, "groups": 2}),
    ((2, 5, 10, 33), (20, 5, 5, 3), {"stride": (1, 2), "padding": (2, 0)}),
    ((2, 16, 70), (32, 16, 5), {"padding": 2}),
    ((1, 8, 5, 6, 17), (16, 8, 3, 3, 3), {"padding": 1}),
    ((2, 32, 7, 7), (64, 32, 3, 3), {"padding": 1}),          # rows folded into M = 49
    ((1, 24, 13, 11), (32, 24, 3, 3), {"stride": 2, "padding": 1}),   # M = 7 x 6
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs", CASES)
def test_conv_forward_and_gradients_match_torch_on_the_cpu(x_shape, w_shape, kwargs):
    x, w = _data(*x_shape), _data(*w_shape, seed=1)
    d = len(x_shape) - 2
    k = int(np.prod(w_shape[1:]))
    px, pw = (Tensor(a, device="cpu", requires_grad=True) for a in (x, w))
    y = getattr(F, f"conv{d}d")(px, pw, **kwargs)
    r = _data(*y.shape, seed=2)
    (y * Tensor(r, device="cpu")).sum().backward()
    tx, tw = (torch.from_numpy(a).double().requires_grad_() for a in (x, w))
    ty = getattr(TF, f"conv{d}d")(tx, tw, **kwargs)
    (ty * torch.from_numpy(r).double()).sum().backward()
    _close(y, ty, k)
    _close(px.grad, tx.grad, int(np.prod(w_shape)) // w_shape[1])
    _close(pw.grad, tw.grad, int(np.prod(y.shape)) // y.shape[1], rtol=1e-5)


def test_the_benchmark_shape_is_packed_with_a_whole_number_of_blocks():
    # conv2d 8x64x56x56 3x3 (benchmarks/bench.py): 7 register blocks of 8 along each row, a
    # group's blocks whole rows of the folded 56 x 56 positions
    item = _conv_item(_data(1, 64, 56, 56), _data(64, 64, 3, 3, seed=1), padding=1)
    contraction, packing = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.sizes == (56 * 56, 64, 576)
    assert 56 % packing.rows == 0 and packing.rows * packing.blocks % 56 == 0
    assert 576 % packing.depth == 0


def test_float16_conv_sums_in_float32():
    # 288 products of 0.1 * 0.1 summed in float16 lose about a unit in the last place each
    x = np.full((1, 32, 8, 16), 0.1, np.float32)
    w = np.full((16, 32, 3, 3), 0.1, np.float32)
    out = F.conv2d(Tensor(x, float16, device="cpu"), Tensor(w, float16, device="cpu"))
    exact = 288 * float(np.float16(0.1)) ** 2
    assert out.dtype == float16
    np.testing.assert_allclose(out.numpy().astype(np.float64), exact, rtol=1e-3)


def test_a_depthwise_conv_keeps_three_sums():
    # one output channel per group is no matmul's N: a K axis would only add a div and a mod
    # per term (0.65x the speed at 8x64x56x56, groups=64); the sum stays over (channel, kh, kw)
    item = _conv_item(_data(2, 32, 12, 16), _data(32, 1, 3, 3, seed=1), padding=1, groups=32)
    node = item.root
    while node.op is not GraphOp.REDUCE:
        node = node.src[0]
    assert len(node.arg[1]) == 3 and pack.find(item.root, item.inputs, LOOPS) is None


def test_float16_packed_conv_and_its_gradients_round_once():
    # float16 operands of a packed conv are widened as they are staged and summed in float32:
    # each result is within one float16 rounding of the exact float64 value
    x = _data(2, 16, 9, 24).astype(np.float16)
    w = _data(32, 16, 3, 3, seed=1).astype(np.float16)
    item = _conv_item(x.astype(np.float32), w.astype(np.float32), padding=1, stride=(1, 2))
    assert pack.find(item.root, item.inputs, LOOPS) is not None
    px, pw = (Tensor(a, float16, device="cpu", requires_grad=True) for a in (x, w))
    y = F.conv2d(px, pw, padding=1, stride=(1, 2))
    r = _data(*y.shape, seed=2).astype(np.float16)
    (y * Tensor(r, float16, device="cpu")).sum().backward()
    tx, tw = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (x, w))
    ty = TF.conv2d(tx, tw, padding=1, stride=(1, 2))
    (ty * torch.from_numpy(r.astype(np.float64))).sum().backward()
    for ours, theirs in ((y, ty), (px.grad, tx.grad), (pw.grad, tw.grad)):
        assert ours.dtype == float16
        expected = theirs.detach().numpy()
        np.testing.assert_allclose(ours.numpy().astype(np.float64), expected, rtol=1e-3,
                                   atol=1e-3 * np.abs(expected).max())


def test_a_conv_on_a_7x7_map_folds_its_rows_into_m():
    # ResNet-18's last stage, 512 channels on a 7 x 7 map (K = 4608): a 7-wide row alone is
    # too short for a matmul's M (it ran as 512 x 49 scalar dot products, about 1 GFLOP/s);
    # the output rows fold into M = 49, cut into register blocks of 7 (one output row each)
    item = _conv_item(_data(1, 512, 7, 7), _data(512, 512, 3, 3, seed=1), padding=1)
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the 7 x 7 conv's sum is not packed"
    contraction, packing = found
    shape = contraction.reduce.src[0].shape
    assert contraction.sizes == (49, 512, 4608)
    assert [shape[a] for a in contraction.m_axes] == [7, 7]
    assert contraction.fold == (contraction.m - 1,)
    assert packing.rows == 7 and 49 % (packing.rows * packing.blocks) == 0


def test_a_long_row_folds_whole_rows_in_blocks_within_a_row():
    item = _conv_item(_data(1, 16, 4, 40), _data(32, 16, 3, 3, seed=1), padding=1)
    contraction, packing = pack.find(item.root, item.inputs, LOOPS)
    assert len(contraction.fold) == 1 and contraction.sizes == (160, 32, 144)
    assert packing.rows == 8


def test_a_folded_conv_computes_in_the_interpreter():
    x, w = _data(1, 8, 3, 4), _data(40, 8, 3, 3, seed=1)
    item = _conv_item(x, w, padding=1)
    contraction, packing = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.sizes == (12, 40, 72) and packing.rows == 4
    kernel = lower(item.root, item.inputs, LOOPS)
    # the kernel reads the input as scheduled (padded by a copy before it, or in place)
    by_size = {a.size: a.ravel() for a in (x, w, np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))))}
    out = np.zeros(40 * 3 * 4, np.float32)
    interpreter.run(kernel, [out, *(by_size[node.size] for node in item.inputs)])
    expected = TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
    _close(torch.from_numpy(out.reshape(1, 40, 3, 4)), expected, 72)


def _innermost_range_at_output_store(kernel) -> int:
    """The trip count of the innermost loop around the first store into PARAM 0."""
    nodes, open_ranges = kernel.nodes, []
    for node in nodes:
        if node.op is Op.RANGE:
            open_ranges.append(node)
        elif node.op is Op.END and node.src and nodes[node.src[0]] in open_ranges:
            open_ranges.remove(nodes[node.src[0]])
        elif node.op is Op.STORE and nodes[node.src[0]].op is Op.PARAM and \
                nodes[node.src[0]].arg == 0:
            return nodes[open_ranges[-1].src[1]].arg
    raise AssertionError("no store into the output")


@pytest.mark.parametrize("k", [7, 3])
def test_a_block_of_positions_by_channels_stores_along_the_positions(k):
    # a stem (7x7, stride 2: m the positions, n 32 channels) and a 7 x 7 map's 3x3 conv store
    # their blocks along the output's contiguous axis, the rows, not across 32 channels a
    # plane apart
    x, w = _data(1, 3, 56, 56), _data(64, 3, k, k, seed=1)
    item = _conv_item(x, w, stride=2, padding=k // 2)
    contraction, packing = pack.find(item.root, item.inputs, LOOPS)
    assert contraction.sizes[1] == 64 and packing.width == 32
    assert _innermost_range_at_output_store(lower(item.root, item.inputs, LOOPS)) == \
        packing.rows


def test_a_one_block_conv_stores_its_registers_to_the_output():
    # EfficientNet's 16 -> 96 1x1 conv: K fits one depth block, so the block's sums go from
    # the registers to the output; through LOCAL (zeroed, added into, copied out) was a fifth
    # of its time. Only B's panel is in LOCAL, and the stores are vector stores.
    x, w = _data(1, 16, 16, 16), _data(96, 16, 1, 1, seed=1)
    item = _conv_item(x, w)
    kernel = lower(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert [n.op for n in kernel.nodes].count(Op.LOCAL) == 1
    from portkit.reference_backends.cpu.renderer import CPURenderer
    assert "pk_f32x16_store(&data0[" in CPURenderer().render(kernel)
    out = F.conv2d(Tensor(x, device="cpu"), Tensor(w, device="cpu"))
    _close(out, TF.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double()), 16)
