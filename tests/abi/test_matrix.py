"""Matrix units (portkit/abi/matrix.py): the layout tables are checked when a device declares
them, the MMA node is validated and serialized, and the interpreter runs it as spec.mma says."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit.abi import CapabilityError, InvalidKernel, Kernel, KernelBuilder, Op, dtypes, spec
from portkit.abi.interpreter import run
from portkit.abi.matrix import MatrixUnit, fragment, row_per_thread
from portkit.conformance.case import Context, judge
from portkit.conformance.matrix_cases import layout_table, make, mma_kernel, tiles_of
from portkit.reference_backends.interpreter.capabilities import MATRIX_UNITS, capabilities

F16, F32 = dtypes.float16, dtypes.float32
UNIT = MATRIX_UNITS[0]


def replicated() -> MatrixUnit:
    """A 4×4×2 unit on 4 threads in which every A element is held by two threads, B's column t
    by thread t in a rotated order, and C's column t + 1 by thread t."""
    a = fragment(4, 4, lambda t, e: (e, (t // 2 + e) % 2))
    b = fragment(4, 2, lambda t, e: ((t + e) % 2, t))
    c = fragment(4, 4, lambda t, e: (e, (t + 1) % 4))
    return MatrixUnit(4, 4, 2, 4, F16, F16, F32, a, b, c)


def declare(*units: MatrixUnit) -> None:
    dataclasses.replace(capabilities(), matrix_units=units).validate("test")


def test_declared_units_are_checked():
    declare(*MATRIX_UNITS, replicated())
    twice = dataclasses.replace(UNIT, c=fragment(8, 8, lambda t, e: (t // 2, e)))
    with pytest.raises(CapabilityError, match=r"c gives element \(0, 0\) to several threads"):
        declare(twice)
    gap = dataclasses.replace(UNIT, a=fragment(8, 8, lambda t, e: (t, min(e, 6))))
    with pytest.raises(CapabilityError, match="a leaves 8 of its 8x8 elements to no thread"):
        declare(gap)
    outside = dataclasses.replace(UNIT, b=fragment(8, 8, lambda t, e: (t, e + 1)))
    with pytest.raises(CapabilityError, match=r"b names \(0, 8\), not a \(row, col\)"):
        declare(outside)
    with pytest.raises(CapabilityError, match="one tuple per thread"):
        declare(dataclasses.replace(UNIT, threads=16))
    with pytest.raises(CapabilityError, match="tuple of portkit.abi.matrix.MatrixUnit"):
        declare([UNIT])
    caps = dataclasses.replace(capabilities(), dtypes=frozenset({dtypes.bool_, dtypes.int32, F32}),
                               matrix_units=(MATRIX_UNITS[1],))
    with pytest.raises(CapabilityError, match=r"uses dtypes \['float16'\]"):
        caps.validate("test")


def test_mma_kernels_round_trip_and_are_validated():
    kernel = mma_kernel(replicated(), 3)
    assert Kernel.from_json(kernel.to_json()) == kernel
    nodes = list(kernel.nodes)
    at = next(i for i, n in enumerate(nodes) if n.op is Op.MMA)
    mma = nodes[at]
    with pytest.raises(InvalidKernel, match="a multiple of which must make the block"):
        Kernel.from_json(dataclasses.replace(kernel, block=(6, 1, 1)).to_json())
    loaded = nodes[mma.src[-1]].src[0]          # the LOAD that initialises the last ACC
    for last, message in ((mma.src[0], r"C fragment must be float32, got \['float16', "),
                          (loaded, "C fragment must be ACC registers"),
                          (mma.src[-2], "names one ACC twice")):
        changed = dataclasses.replace(mma, src=mma.src[:-1] + (last,))
        with pytest.raises(InvalidKernel, match=message):
            Kernel.from_json(dataclasses.replace(
                kernel, nodes=tuple(nodes[:at] + [changed] + nodes[at + 1:])).to_json())
    b = KernelBuilder("branch")
    out = b.param(F32)
    acc = [b.acc(b.const(0.0, F32)) for _ in range(8)]
    one = b.const(1.0, F32)
    with b.branch(b.const(True, dtypes.bool_)):
        b.add(Op.MMA, None, tuple([one] * 16 + acc), UNIT)
    b.store(out, b.const(0), acc[0])
    with pytest.raises(InvalidKernel, match="MMA inside an IF can deadlock"):
        b.build(block=(8, 1, 1))


def test_a_device_without_the_unit_refuses_the_kernel():
    kernel = mma_kernel(UNIT, 1)
    capabilities(matrix_units=True).check_launch(kernel)
    with pytest.raises(CapabilityError, match=r"matrix units \['m8n8k8_float32_float32'\]"):
        capabilities().check_launch(kernel)


@pytest.mark.parametrize("unit", [*MATRIX_UNITS, replicated()], ids=lambda u: u.name)
def test_the_interpreter_multiplies_tiles_in_the_declared_layout(unit):
    rng = np.random.default_rng(0)
    a, b, c = tiles_of(unit, "random", rng, 3, True)
    out = c.reshape(-1).copy()
    run(mma_kernel(unit, 3), [a.reshape(-1), b.reshape(-1), out, layout_table(unit)])
    exact = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_allclose(out.reshape(c.shape), exact, rtol=1e-6)


def test_the_bound_accepts_any_order_and_rejects_a_narrow_accumulator():
    ctx = Context(capabilities(matrix_units=True), quick=True)
    case = make(ctx, MATRIX_UNITS[1], "precision")
    a, b, c, _ = case.inputs
    tiles = (-1, 8, 8)
    check = case.checks[0]
    forward = c.reshape(tiles).astype(np.float32).copy()
    narrow = c.reshape(tiles).astype(np.float16)
    for k in reversed(range(8)):      # float32 sums, last product first: within the bound
        forward += np.einsum("tm,tn->tmn", a.reshape(tiles)[:, :, k], b.reshape(tiles)[:, k, :])
        narrow += np.einsum("tm,tn->tmn", a.reshape(tiles)[:, :, k].astype(np.float16),
                            b.reshape(tiles)[:, k, :]).astype(np.float16)
    assert judge(check, forward.reshape(-1), case.inputs).ok
    verdict = judge(check, narrow.astype(np.float32).reshape(-1), case.inputs)
    assert not verdict.ok and "bound" in verdict.message
    assert spec.mma_bound(a.reshape(tiles), b.reshape(tiles), c.reshape(tiles), F32).max() < 0.01


def test_row_per_thread_is_the_layout_it_says():
    unit = row_per_thread(4, F16, F32)
    assert unit.a[2] == ((2, 0), (2, 1), (2, 2), (2, 3))
    assert unit.b[2] == ((0, 2), (1, 2), (2, 2), (3, 2)) and unit.operand_counts == (4, 4, 4)
    assert unit.name == "m4n4k4_float16_float32" and not unit.problems()


def test_a_unit_that_flushes_denormals_says_so_and_is_checked_so():
    flushing = dataclasses.replace(UNIT, denormals="flush")
    assert flushing.problems() == [] and MatrixUnit.from_json(flushing.to_json()) == flushing
    assert UNIT.to_json()["denormals"] == "preserve"
    assert dataclasses.replace(UNIT, denormals="daz").problems() == [
        "denormals must be 'preserve' or 'flush', got 'daz'"]
    # a denormal times a large value: far above the accumulator's error where it is kept
    a, b = np.zeros((1, 8, 8), np.float32), np.zeros((1, 8, 8), np.float32)
    c = np.zeros((1, 8, 8), np.float32)
    a[0, 0, 0], b[0, 0, 0] = 1e-40, 1e30
    kept, flushed = spec.mma(a, b, c, F32), spec.mma(a, b, c, F32, flush=True)
    assert kept[0, 0, 0] == np.float32(float(a[0, 0, 0]) * 1e30) and flushed[0, 0, 0] == 0
    assert spec.mma_bound(a, b, c, F32, flush=True)[0, 0, 0] < 1e-30
    out = c.reshape(-1).copy()
    run(mma_kernel(flushing, 1), [a.reshape(-1), b.reshape(-1), out, layout_table(flushing)])
    assert out[0] == 0      # the interpreter runs the unit as declared
    run(mma_kernel(UNIT, 1), [a.reshape(-1), b.reshape(-1), c.reshape(-1), layout_table(UNIT)])
    assert c.reshape(-1)[0] == kept[0, 0, 0]
