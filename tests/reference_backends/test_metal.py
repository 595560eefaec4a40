"""The Metal backend without a Mac: the MSL renderer's numerics through the host shim (tiers
1-5), its shape, and a clean 'Metal needs macOS' elsewhere.

Nothing here compiles MSL with Apple's compiler or runs it on an Apple GPU (no Mac is
available); docs/backends/metal.md lists exactly what is and is not verified.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from portkit.abi import BackendUnavailable, KernelBuilder, Op, dtypes
from portkit.abi.dtypes import DType
from portkit.conformance import Options, Target
from portkit.conformance import run as conform
from portkit.conformance.shims import run_conformance, shim_device, tensor_kernels
from portkit.reference_backends import metal
from portkit.reference_backends.metal.capabilities import capabilities
from portkit.reference_backends.metal.renderer import MetalRenderer


@pytest.fixture(scope="module")
def shim():
    return shim_device("metal")


def run(shim, kernel, arrays, scalars=()):
    """Runs `kernel` on copies of `arrays` through the shim; returns them after the run."""
    arrays = [np.array(a) for a in arrays]
    program = shim.program(kernel.name, shim.compiler.compile(shim.renderer.render(kernel)))
    program([a.view(np.uint8) for a in arrays], list(scalars), kernel.grid, kernel.block)
    return arrays


def test_host_shim_runs_conformance_like_the_cpu(shim):
    # Quick tiers 1-3: the CPU passes all 290; Metal must pass all but the float64 cases,
    # which it declares unsupported (MSL has no double), and the matrix-unit case (the shim
    # declares no unit: ops/MMA/none).
    report = run_conformance(shim, quick=True)
    by_status: dict[str, list[str]] = {}
    for result in report.results:
        by_status.setdefault(result.status.value, []).append(result.case.id)
    assert not by_status.get("failed"), "\n".join(
        f"{r.case.id}: {r.message}" for r in report.results if r.status.value == "failed")
    assert all("float64" in case or case == "ops/MMA/none" for case in by_status["unsupported"])
    assert len(by_status["passed"]) + len(by_status["unsupported"]) == len(report.results)
    assert len(by_status["passed"]) >= 260


def test_host_shim_runs_tensor_ops_and_models_like_the_cpu(shim):
    # Every tier 4 and 5 kernel (lowered as for a many-threads device) must build as MSL; then
    # the Tensor-op and model cases run through the shim against float64 numpy, as on the CPU.
    kernels = tensor_kernels(shim.capabilities)
    assert len(kernels) > 150
    target = Target(shim, shim.name)
    failed = [r for r in target.runtime.compile_all(kernels, 2) if isinstance(r, Exception)]
    assert not failed, failed[0]
    report = conform(target, Options(tiers=(4, 5), jobs=2))
    by_status: dict[str, list[str]] = {}
    for result in report.results:
        by_status.setdefault(result.status.value, []).append(result.case.id)
    assert not by_status.get("failed"), "\n".join(
        f"{r.case.id}: {r.message}" for r in report.results if r.status.value == "failed")
    assert all("float64" in case for case in by_status.get("unsupported", []))
    assert len(by_status["passed"]) >= 90 and any(c.startswith("models/") for c in
                                                   by_status["passed"])


def wide_int_values(dtype: DType) -> np.ndarray:
    """Integers just off a rounding tie of bfloat16 and half: they round wrongly if rounded
    twice (to float, then to 16 bits)."""
    bits = dtype.bits - (dtype.kind == "int")
    values = [(1 << (bits - 1)) + (1 << (bits - 9)) + 1, (1 << 30) + (1 << 19) + 1, 3, 0]
    if dtype.kind == "int":
        values += [-v for v in values[:2]]
    return np.array(values, dtype.np)


def round_to_bits(value: int, bits: int) -> int:
    """`value` rounded to `bits` significant bits, ties to even: exact, in integers."""
    drop = max(abs(value).bit_length() - bits, 0)
    if drop == 0:
        return value
    kept, rest = divmod(abs(value), 1 << drop)
    half = 1 << (drop - 1)
    kept += rest > half or (rest == half and kept & 1)
    return (kept << drop) * (1 if value > 0 else -1)


@pytest.mark.parametrize("source", [dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64],
                         ids=lambda d: d.name)
def test_wide_integers_round_once_to_16_bit_floats(shim, source):
    k = KernelBuilder(f"wide_{source.name}")
    x, bf, half = k.param(source), k.param(dtypes.bfloat16), k.param(dtypes.float16)
    i = k.special("group", 0)
    k.store(bf, i, k.cast(k.load(x, i), dtypes.bfloat16))
    k.store(half, i, k.cast(k.load(x, i), dtypes.float16))
    values = wide_int_values(source)
    n = values.size
    kernel = k.build(grid=(n, 1, 1))
    _, got_bf, got_half = run(shim, kernel, [values, np.zeros(n, dtypes.bfloat16.np),
                                              np.zeros(n, np.float16)])
    # numpy and ml_dtypes convert integers to bfloat16 through float32 (twice rounded), so
    # the oracle rounds the integer itself; no half tie exists below its overflow at 65520.
    expected_bf = [round_to_bits(v, 8) for v in values.tolist()]
    assert got_bf.astype(np.float64).tolist() == expected_bf
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got_half, values.astype(np.float64).astype(np.float16))


def test_renderer_writes_msl():
    k = KernelBuilder("tile")
    x, out = k.param(dtypes.float16), k.param(dtypes.bfloat16)
    n = k.var("n")
    lane = k.special("local", 0)
    tile = k.local(dtypes.float16, 32)
    k.store(tile, lane, k.alu(Op.MUL, k.load(x, lane), k.const(0.5, dtypes.float16)))
    k.barrier()
    value = k.load(tile, k.alu(Op.SUB, k.const(31), lane))
    inside = k.alu(Op.CMPLT, lane, n)
    k.store(out, lane, k.cast(k.cast(value, dtypes.int16, bitcast=True), dtypes.bfloat16),
            inside)
    source = MetalRenderer().render(k.build(block=(32, 1, 1)))
    assert source.startswith("#include <metal_stdlib>\nusing namespace metal;\n")
    assert ("kernel void k_tile(device half *data0 [[buffer(0)]], device ushort *data1 "
            "[[buffer(1)]], constant int *pk_vars [[buffer(2)]],") in source
    assert "const int var_n = pk_vars[0];" in source
    assert "[[threadgroup_position_in_grid]]" in source
    assert "threadgroup half local4[32];" in source
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in source
    assert "0.5h" in source and "as_type<short>(" in source and "pk_bf16_store(" in source


def test_buffers_and_scalars_fit_metals_31_slots(shim):
    # Metal binds at most 31 buffers ([[buffer(0..30)]]). All scalars share one slot, so a
    # kernel with the most buffers the capabilities allow and 16 scalars still fits (before,
    # each scalar took a slot of its own: 30 buffers + 16 scalars asked for slot 45).
    import re
    k = KernelBuilder("many")
    params = [k.param(dtypes.int32) for _ in range(capabilities().max_buffers)]
    lane = k.special("local", 0)
    total = k.load(params[0], lane)
    for param in params[1:-1]:
        total = k.alu(Op.ADD, total, k.load(param, lane))
    for name in "abcdefghijklmnop":
        total = k.alu(Op.ADD, total, k.var(name))
    k.store(params[-1], lane, total)
    kernel = k.build(block=(4, 1, 1))
    source = MetalRenderer().render(kernel)
    assert max(int(slot) for slot in re.findall(r"\[\[buffer\((\d+)\)\]\]", source)) <= 30
    arrays = [np.full(4, i, np.int32) for i in range(len(params))]
    got = run(shim, kernel, arrays, scalars=range(100, 116))[-1]
    assert got.tolist() == [sum(range(len(params) - 1)) + sum(range(100, 116))] * 4


def test_capabilities_leave_out_float64():
    caps = capabilities().validate("metal")
    assert dtypes.float64 not in caps.dtypes and dtypes.bfloat16 in caps.dtypes
    assert caps.denormals == "flush" and caps.max_buffers == 30


def test_elsewhere_metal_says_it_needs_macos(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(BackendUnavailable) as info:
        metal.backend.load()
    assert info.value.reason == "Metal needs macOS"
    assert "Mac" in info.value.fix and "cpu" in info.value.fix
