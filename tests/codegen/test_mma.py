"""Matmuls on a declared matrix unit (codegen/mma.py): the interpreter with units declared runs
them as MMA nodes, within the matmul error bound of the scalar path's result; a device that
declares none gets the scalar kernels it always had."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import backends, runtime
from portkit.abi import CapabilityError, Op, dtypes, spec
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

ORDER = (0, 2, 3, 1)      # thread t holds row ORDER[t]: not linear in t's bits
SCRAMBLED = MatrixUnit(4, 4, 4, 4, dtypes.float32, dtypes.float32, dtypes.float32,
                       fragment(4, 4, lambda t, e: (ORDER[t], e)),
                       fragment(4, 4, lambda t, e: (e, ORDER[t])),
                       fragment(4, 4, lambda t, e: (ORDER[t], e)))


def _device(name: str, units: tuple[MatrixUnit, ...] | None) -> str:
    """The interpreter registered as `name`, declaring `units` (None: its own MATRIX_UNITS)."""
    caps = capabilities(matrix_units=True)
    if units is not None:
        caps = dataclasses.replace(caps, matrix_units=units)
    try:
        runtime.register(runtime.Runtime(name, dataclasses.replace(
            backends.load("interpreter"), name=name, capabilities=caps.validate(name))))
    except ValueError:      # registered by an earlier test in this process
        pass
    return name


def _mma_nodes(result: Tensor) -> list:
    return [n for kernel in result.schedule() for n in kernel.nodes if n.op is Op.MMA]


CASES = {
    "square": (lambda x, y: x @ y, (16, 24), (24, 8), np.float32),
    "ragged edges": (lambda x, y: x @ y, (13, 21), (21, 11), np.float32),
    "float16": (lambda x, y: x @ y, (16, 16), (16, 16), np.float16),
    "batched, fused prologue": (lambda x, y: (x * 2.0) @ y.permute(0, 2, 1), (2, 12, 20),
                                (2, 9, 20), np.float32),
}


# (case, units): the interpreter's 8x8x8 units (None) on every case; the scrambled unit, which
# takes float32 inputs, on the float32 ones
RUNS = [(case, None) for case in CASES] + [
    (case, (SCRAMBLED,)) for case, spec_ in CASES.items() if spec_[3] == np.float32]


@pytest.mark.parametrize("case, units", RUNS,
                         ids=[f"{c}-{'8x8x8' if u is None else 'scrambled'}" for c, u in RUNS])
def test_a_matmul_that_fits_a_unit_runs_on_it(case, units):
    fn, a_shape, b_shape, dtype = CASES[case]
    device = _device("interpreter-mma" if units is None else "interpreter-mma-scrambled", units)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(a_shape).astype(dtype), rng.standard_normal(b_shape).astype(dtype)
    on_unit = fn(Tensor(a, device=device), Tensor(b, device=device))
    nodes = _mma_nodes(on_unit)
    assert nodes and all(n.arg in (units or capabilities(True).matrix_units) for n in nodes)
    scalar = fn(Tensor(a, device="interpreter"), Tensor(b, device="interpreter"))
    assert not _mma_nodes(scalar), "a device without units got an MMA node"
    got, want = on_unit.numpy().astype(np.float64), scalar.numpy().astype(np.float64)
    k = a_shape[-1]
    magnitude = np.abs(fn(Tensor(np.abs(a).astype(np.float32)), Tensor(
        np.abs(b).astype(np.float32))).numpy())
    gamma = 2 * (k + 1) * float(np.finfo(np.float32).eps)
    rounding = 2 * float(np.finfo(dtype).eps) * np.abs(want)   # the output dtype's rounding
    assert np.all(np.abs(got - want) <= gamma * magnitude + rounding), np.abs(got - want).max()


def test_a_unit_of_other_dtypes_leaves_the_matmul_scalar():
    device = _device("interpreter-mma-float16-only", (capabilities(True).matrix_units[1],))
    x = Tensor(np.ones((16, 16), np.float32), device=device)
    assert not _mma_nodes(x @ x)
    assert _mma_nodes(x.cast(dtypes.float16) @ x.cast(dtypes.float16))


def test_the_bound_of_one_tile_covers_the_scalar_path():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((1, 8, 8)), rng.standard_normal((1, 8, 8))
    sequential = np.zeros((1, 8, 8), np.float32)
    for k in range(8):
        sequential += (a[:, :, k:k + 1] * b[:, k:k + 1, :]).astype(np.float32)
    c = np.zeros((1, 8, 8))
    exact = a @ b
    assert np.all(np.abs(sequential - exact) <= spec.mma_bound(a, b, c, dtypes.float32))


def test_a_renderer_without_units_names_the_unit_it_cannot_render():
    from portkit.conformance.matrix_cases import mma_kernel
    from portkit.reference_backends.opencl.renderer import OpenCLRenderer

    with pytest.raises(CapabilityError, match="OpenCLRenderer renders no matrix unit, yet the "
                       "kernel uses m4n4k4_float32_float32"):
        OpenCLRenderer(fp16=False, fp64=False).render(mma_kernel(SCRAMBLED, 1))
