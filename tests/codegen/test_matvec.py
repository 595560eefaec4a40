"""Matrix-vector products (M = 1: an LSTM step's h @ R.T, GPT-2 decode's projections and its
tied LM head) on a device whose threads are loops: the lowered kernel's partial sums are runs
of lanes along the axis that is contiguous in W (codegen/lanes.py), and the results match
numpy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen import lanes
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
WIDTHS = {dtypes.float32: 8}        # AVX2's 256-bit vectors
RNG = np.random.default_rng(0)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _kernel(x_shape: tuple[int, int], w_shape: tuple[int, int], transposed: bool,
            caps=LOOPS):
    x, w = (Tensor(np.zeros(s, np.float32), device="interpreter") for s in (x_shape, w_shape))
    item, = schedule.create_schedule([(x @ (w.transpose(0, 1) if transposed else w)).lazy])
    return lower(item.root, item.inputs, caps)


def _product_accumulators(kernel) -> set[int]:
    """The ACCs that a loop adds a product into: ASSIGN(acc, ADD(acc, MUL) or MULACC)."""
    nodes = kernel.nodes
    found = set()
    for node in nodes:
        if node.op is Op.ASSIGN:
            acc, value = node.src
            if nodes[value].op is Op.MULACC or (nodes[value].op is Op.ADD and any(
                    nodes[s].op is Op.MUL for s in nodes[value].src if s != acc)):
                found.add(acc)
    return found


@pytest.mark.parametrize("x_shape, w_shape", [((1, 256), (1024, 256)), ((1, 768), (2304, 768)),
                                              ((1, 768), (50257, 768))])
def test_x_at_w_transposed_sums_in_lanes_along_k(x_shape, w_shape):
    # each output is a dot product of two contiguous rows: its partial sums along k multiply
    # a vector of x by a vector of W's row, no operand shared by the lanes
    kernel = _kernel(x_shape, w_shape, transposed=True)
    runs = lanes.find(kernel, WIDTHS)
    products = _product_accumulators(kernel)
    assert products and {acc for run in runs for acc in run.accs} == products
    assert all(run.paired is not None and not run.fused for run in runs)
    assert {kernel.nodes[run.buffer].arg for run in runs} == {2}           # W's rows
    assert {kernel.nodes[run.paired[0]].arg for run in runs} == {1}        # x's vector


@pytest.mark.parametrize("registers, rows", [((16, 32), 4), ((32, 64), 8)])
def test_the_rows_of_w_a_thread_sums_at_once_fit_the_registers(registers, rows):
    # 16 partial sums per row of W: AVX2's sixteen 256-bit registers hold 4 rows' beside x's
    # vectors, AVX-512's thirty-two 512-bit ones 8
    caps = dataclasses.replace(LOOPS, vector_registers=registers)
    kernel = _kernel((1, 768), (2304, 768), transposed=True, caps=caps)
    assert len(_product_accumulators(kernel)) == rows * 16


def test_x_at_w_sums_in_lanes_along_n():
    # each k adds x[k] times a contiguous row of W into the outputs' lanes
    kernel = _kernel((1, 768), (768, 3072), transposed=False)
    runs = lanes.find(kernel, WIDTHS)
    products = _product_accumulators(kernel)
    assert products and {acc for run in runs for acc in run.accs} == products
    assert all(run.shared is not None and run.paired is None for run in runs)


def _cpu_schedule(x_shape: tuple[int, int], w_shape: tuple[int, int], transposed: bool):
    x, w = (Tensor(np.zeros(s, np.float32), device="cpu") for s in (x_shape, w_shape))
    return schedule.create_schedule([(x @ (w.transpose(0, 1) if transposed else w)).lazy])


def test_x_at_w_row_major_sums_slices_of_rows_then_the_slices():
    # each of the first kernel's partial sums reads 16 consecutive rows of W whole (row major,
    # the slice index leading), and the second adds the 48 slices' sums
    first, second = _cpu_schedule((1, 768), (768, 3072), transposed=False)
    assert first.root.shape[0] == 768 // 16 and first.root.shape[-2:] == (3072, 1)
    assert second.root.shape == (1, 3072)
    # rows contiguous along k (x @ W.T), and a W small enough to stay cached, are not cut
    assert len(_cpu_schedule((1, 768), (2304, 768), transposed=True)) == 1
    assert len(_cpu_schedule((1, 64), (64, 64), transposed=False)) == 1


@pytest.mark.parametrize("x_shape, w_shape, transposed", [
    ((1, 256), (1024, 256), True), ((1, 128), (512, 128), True), ((1, 768), (2304, 768), True),
    ((1, 768), (50257, 768), True), ((1, 768), (768, 3072), False), ((3, 256), (1024, 256), True),
    ((4, 3072), (3072, 768), False), ((1, 1000), (1000, 520), False)])
def test_matches_numpy(x_shape, w_shape, transposed):
    x, w = _floats(*x_shape), _floats(*w_shape)
    weight = Tensor(w, device="cpu")
    actual = (Tensor(x, device="cpu") @ (weight.transpose(0, 1) if transposed else weight)).numpy()
    w64 = (w.T if transposed else w).astype(np.float64)
    expected = x.astype(np.float64) @ w64
    # relative to the sum of the terms' magnitudes, the scale a float sum's error has
    scale = np.abs(x.astype(np.float64)) @ np.abs(w64)
    worst = np.max(np.abs(actual - expected) / scale)
    assert worst <= 1e-5, f"largest error {worst:.2e} of the terms' magnitudes"


@pytest.mark.parametrize("x_shape, w_shape", [((1, 256), (64, 256)), ((1, 128), (40, 128)),
                                              ((2, 64), (40, 64))])
def test_the_partial_sums_are_added_in_vectors_to_the_same_bits(x_shape, w_shape):
    # each row's 16 partial sums are added by adjacent pairs, level after level; the rows of a
    # group add theirs side by side (even lanes plus odd lanes of two rows' vectors), where
    # scalar, those additions were a third of an LSTM step's h @ R.T (1024 x 256: 19 -> 15 us
    # on one thread), with the same bits as the scalar trees
    from portkit import runtime
    from portkit.reference_backends.cpu.renderer import CPURenderer
    kernel = _kernel(x_shape, w_shape, transposed=True)
    runs = lanes.find(kernel, {dtypes.float32: 16})
    assert runs and all(lanes.tree(kernel, run) is not None for run in runs)
    source = CPURenderer().render(kernel)
    assert " = (pk_f32x16){acc" in source
    x, w = _floats(*x_shape), _floats(*w_shape)
    out = np.zeros((x_shape[0], w_shape[0]), np.float32)
    expected, *_ = runtime.get("interpreter").run(kernel, out, x, w)
    actual, *_ = runtime.get("cpu").run(kernel, out, x, w)
    np.testing.assert_array_equal(actual, expected)
