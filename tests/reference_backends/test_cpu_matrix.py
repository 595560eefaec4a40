"""The CPU backend's matrix units: vdpbf16ps and vpdpbusd, declared where the host has AVX-512
BF16 and VNNI and absent elsewhere; bfloat16 matmuls on the first (packed panels,
codegen/pack.py) within the MMA error bound of the exact product, uint8 @ int8 on the second
exactly, each as one instruction per register row and vector; conformance's MMA cases on them,
denormal edges included (vdpbf16ps declares that it flushes them)."""
from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest

from portkit.abi import Op, spec
from portkit.abi.dtypes import bfloat16, float32, int8, int32, uint8
from portkit.conformance import runner, suite
from portkit.conformance.case import Status
from portkit.conformance.matrix_cases import KINDS, case_id
from portkit.conformance.target import Target
from portkit.reference_backends.cpu import capabilities as cpu_capabilities
from portkit.reference_backends.cpu import runtime as cpu_runtime
from portkit.reference_backends.cpu.renderer import DPBF16, DPBUSD, CPURenderer
from portkit.tensor import Tensor

HAS_BF16 = "avx512_bf16" in cpu_runtime.cpu_flags()
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="the host has no AVX-512 BF16")


def test_the_units_are_well_formed_and_declared_with_their_flags():
    assert DPBF16.problems() == [] and DPBF16.denormals == "flush"
    assert (DPBF16.m, DPBF16.n, DPBF16.k, DPBF16.threads) == (1, 16, 2, 1)
    assert DPBUSD.problems() == [] and (DPBUSD.m, DPBUSD.n, DPBUSD.k) == (1, 16, 4)
    assert (DPBUSD.a_dtype, DPBUSD.b_dtype, DPBUSD.acc_dtype) == (uint8, int8, int32)
    assert cpu_capabilities.matrix_units({"avx512f", "avx512_bf16"}) == (DPBF16,)
    assert cpu_capabilities.matrix_units({"avx512f", "avx512_vnni"}) == (DPBUSD,)
    assert cpu_capabilities.matrix_units({"avx512_vnni", "avx512_bf16"}) == (DPBF16, DPBUSD)
    assert cpu_capabilities.matrix_units({"avx512f", "avx2"}) == ()


def test_the_device_declares_the_unit_only_where_the_host_has_it(monkeypatch):
    compiler = cpu_runtime.CPUCompiler(cpu_runtime.find_compiler())
    monkeypatch.setattr(cpu_capabilities, "cpu_flags", lambda: {"avx512f", "avx2", "sse2"})
    assert cpu_capabilities.capabilities(compiler).matrix_units == ()
    monkeypatch.setattr(cpu_capabilities, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    assert cpu_capabilities.capabilities(compiler).matrix_units == (DPBF16,)
    monkeypatch.setattr(cpu_capabilities, "cpu_flags", lambda: {"avx512f", "avx512_vnni"})
    assert cpu_capabilities.capabilities(compiler).matrix_units == (DPBUSD,)


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)


# (name, A's shape, B's shape as stored, B transposed in the product): edges in m, n and k
# (an odd K ends part way into a k pair), several depth blocks, a batch, and x @ W.T
CASES = [("37x45 @ 45x29", (37, 45), (45, 29), False),
         ("batched 3x20x33 @ 3x33x50", (3, 20, 33), (3, 33, 50), False),
         ("x @ W.T 40x70 @ (50x70).T", (40, 70), (50, 70), True),
         ("deep 24x515 @ 515x40", (24, 515), (515, 40), False)]


@needs_bf16
@pytest.mark.parametrize("name, a_shape, b_shape, transposed", CASES,
                         ids=[case[0] for case in CASES])
def test_a_bfloat16_matmul_runs_on_the_unit_within_the_mma_bound(name, a_shape, b_shape,
                                                                  transposed):
    rng = np.random.default_rng(len(name))
    a, b = _bf16(rng, a_shape), _bf16(rng, b_shape)
    right = Tensor(b, device="cpu")
    result = Tensor(a, device="cpu") @ (right.transpose(-1, -2) if transposed else right)
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBF16 for n in kernel.nodes), kernel.name
    factor = np.swapaxes(b, -1, -2) if transposed else b
    zeros = np.zeros(result.shape, np.float32)
    exact = spec.mma(a, factor, zeros, float32).astype(np.float64)
    # the float32 sums within MMA's bound, then rounded once to bfloat16 (half an ULP)
    bound = spec.mma_bound(a, factor, zeros, float32)
    bound = bound + (np.abs(exact) + bound) * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2
    got = result.numpy().astype(np.float64)
    assert result.dtype == bfloat16
    error = np.abs(got - exact)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert (error <= bound).all(), (f"{name}: worst at {worst}: got {got[worst]}, exact "
                                    f"{exact[worst]}, |error| {error[worst]:.3g} > bound "
                                    f"{bound[worst]:.3g}")


HAS_VNNI = "avx512_vnni" in cpu_runtime.cpu_flags()
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="the host has no AVX-512 VNNI")


@needs_vnni
@pytest.mark.parametrize("name, a_shape, b_shape, transposed", CASES,
                         ids=[case[0] for case in CASES])
def test_a_uint8_by_int8_matmul_runs_on_the_unit_exactly(name, a_shape, b_shape, transposed):
    rng = np.random.default_rng(len(name))
    a = rng.integers(0, 256, a_shape).astype(np.uint8)
    b = rng.integers(-128, 128, b_shape).astype(np.int8)
    right = Tensor(b, device="cpu")
    result = Tensor(a, device="cpu") @ (right.transpose(-1, -2) if transposed else right)
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBUSD for n in kernel.nodes), kernel.name
    factor = np.swapaxes(b, -1, -2) if transposed else b
    exact = a.astype(np.int64) @ factor.astype(np.int64)
    assert result.dtype == int32
    np.testing.assert_array_equal(result.numpy(), exact, err_msg=name)


@needs_vnni
def test_bytes_cast_to_int32_run_on_the_unit():
    """ONNX's MatMulInteger without zero points: uint8 and int8 cast to int32, then @."""
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (64, 96)).astype(np.uint8)
    b = rng.integers(-128, 128, (96, 64)).astype(np.int8)
    result = Tensor(a, device="cpu").cast(int32) @ Tensor(b, device="cpu").cast(int32)
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBUSD for n in kernel.nodes)
    np.testing.assert_array_equal(result.numpy(), a.astype(np.int64) @ b.astype(np.int64))


@needs_bf16
@needs_vnni
def test_a_computed_a_is_staged_in_the_units_dtype_and_runs_on_it():
    """relu(x) @ W and max(a, 7) @ b: A is computed once per group and depth block into LOCAL
    (K = 517: several depth blocks, the last ending part way into a k group)."""
    rng = np.random.default_rng(1)
    x, w = _bf16(rng, (30, 517)), _bf16(rng, (517, 40))
    result = Tensor(x, device="cpu").relu() @ Tensor(w, device="cpu")
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBF16 for n in kernel.nodes)
    assert sum(n.op is Op.LOCAL and n.dtype == bfloat16 for n in kernel.nodes) == 2
    left, zeros = np.maximum(x, 0), np.zeros(result.shape, np.float32)
    exact = spec.mma(left, w, zeros, float32).astype(np.float64)
    # MMA's bound on the float32 sums, then half an ULP of bfloat16 on the result
    bound = spec.mma_bound(left, w, zeros, float32)
    bound = bound + (np.abs(exact) + bound) * float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) / 2
    assert (np.abs(result.numpy().astype(np.float64) - exact) <= bound).all()
    a = rng.integers(0, 256, (30, 517)).astype(np.uint8)
    b = rng.integers(-128, 128, (517, 40)).astype(np.int8)
    sevens = Tensor(np.full(a.shape, 7, np.uint8), device="cpu")
    result = Tensor(a, device="cpu").maximum(sevens) @ Tensor(b, device="cpu")
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBUSD for n in kernel.nodes)
    expected = np.maximum(a, 7).astype(np.int64) @ b.astype(np.int64)
    np.testing.assert_array_equal(result.numpy(), expected)


@pytest.mark.parametrize("a_dtype, b_dtype", [(np.uint8, np.uint8), (np.int16, np.int16)])
def test_integer_matmuls_no_unit_takes_keep_their_kernels(a_dtype, b_dtype):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 100, (40, 70)).astype(a_dtype)
    b = rng.integers(0, 100, (70, 50)).astype(b_dtype)
    result = Tensor(a, device="cpu") @ Tensor(b, device="cpu")
    (kernel,) = result.schedule()
    assert not any(n.op in (Op.MMA, Op.LOCAL) for n in kernel.nodes)
    # the products in the factors' dtype (uint8's wrap), summed in the result's
    products = a[:, :, None] * b[None, :, :]
    expected = products.astype(np.int64).sum(axis=1).astype(result.dtype.np)
    np.testing.assert_array_equal(result.numpy(), expected)


@needs_bf16
def test_the_kernel_is_one_dpbf16_per_register_row_and_vector():
    rng = np.random.default_rng(0)
    result = Tensor(_bf16(rng, (64, 96)), device="cpu") @ Tensor(_bf16(rng, (96, 64)),
                                                                  device="cpu")
    (kernel,) = result.schedule()
    source = CPURenderer().render(kernel)
    assert "#include <immintrin.h>" in source
    # the register block's sums in __m512 vectors, B's k pairs read from the panel as vectors
    assert "= _mm512_dpbf16_ps(acc" in source and "_mm512_loadu_si512(&local" in source
    command = [*cpu_runtime.find_compiler(), *(f for f in cpu_runtime.FLAGS if f != "-shared"),
               "-S", "-x", "c", "-", "-o", "-"]
    assembly = subprocess.run(command, input=source, capture_output=True, text=True, check=True)
    assert "vdpbf16ps" in assembly.stdout


@needs_vnni
def test_the_integer_kernel_is_one_vpdpbusd_per_register_row_and_vector():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (64, 96)).astype(np.uint8)
    b = rng.integers(-128, 128, (96, 64)).astype(np.int8)
    (kernel,) = (Tensor(a, device="cpu") @ Tensor(b, device="cpu")).schedule()
    source = CPURenderer().render(kernel)
    assert "= (pk_i32x16)_mm512_dpbusd_epi32((__m512i)acc" in source
    command = [*cpu_runtime.find_compiler(), *(f for f in cpu_runtime.FLAGS if f != "-shared"),
               "-S", "-x", "c", "-", "-o", "-"]
    assembly = subprocess.run(command, input=source, capture_output=True, text=True, check=True)
    assert "vpdpbusd" in assembly.stdout


def test_a_float32_matmul_keeps_its_fused_multiply_adds():
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal((64, 96)).astype(np.float32) for _ in range(2))
    (kernel,) = (Tensor(x, device="cpu") @ Tensor(w.T.copy(), device="cpu")).schedule()
    assert not any(n.op is Op.MMA for n in kernel.nodes)
    assert "immintrin" not in CPURenderer().render(kernel)


@needs_bf16
def test_conformance_runs_the_units_and_they_pass(tmp_path):
    options = suite.Options(tiers=(2, 3), pattern="*[Mm][Mm][Aa]*", timeout=120,
                            repro_dir=str(tmp_path))
    target = Target.load("cpu")
    statuses = {r.case.id: r.status for r in runner.run(target, options).results}
    units = target.capabilities.matrix_units
    assert DPBF16 in units
    assert statuses == {**{case_id(u, kind): Status.PASSED for u in units for kind in KINDS},
                        **{f"kernels/mma/{u.name}": Status.PASSED for u in units}}


# (input shape, weight shape, stride, padding): one depth block (8 channels x 3 x 3), several
# (64 x 3 x 3), a last block part way through its channels (36), a stride, and channels that
# are no whole groups of the unit's four (which keep the integer kernel without it)
CONVS = [((1, 8, 9, 9), (20, 8, 3, 3), 1, 1), ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
         ((1, 36, 14, 14), (40, 36, 3, 3), 1, 1), ((2, 12, 11, 11), (40, 12, 3, 3), 2, 0),
         ((1, 6, 10, 10), (32, 6, 3, 3), 1, 0)]


@needs_vnni
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", CONVS,
                         ids=[f"{c[0][1]}x{c[0][2]}-{c[1][0]}-s{c[2]}" for c in CONVS])
def test_a_uint8_by_int8_conv_runs_on_the_unit_exactly(x_shape, w_shape, stride, padding):
    """A conv walked by taps: the unit's four k terms are four channels at one tap."""
    rng = np.random.default_rng(x_shape[1])
    x = rng.integers(0, 256, x_shape).astype(np.uint8)
    w = rng.integers(-128, 128, w_shape).astype(np.int8)
    result = Tensor(x, device="cpu").cast(int32).conv2d(
        Tensor(w, device="cpu").cast(int32), stride=stride, padding=padding)
    kernels = result.schedule()
    on_unit = any(n.op is Op.MMA and n.arg == DPBUSD for k in kernels for n in k.nodes)
    assert on_unit == (x_shape[1] % 4 == 0)
    import torch

    exact = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64),
                                       torch.tensor(w, dtype=torch.float64),
                                       stride=stride, padding=padding).numpy()
    np.testing.assert_array_equal(result.numpy(), exact.astype(np.int64))


@needs_vnni
def test_a_computed_conv_input_is_staged_and_runs_on_the_unit():
    """max(x, 7) conv w, stride 2: A is staged per group (a third LOCAL), its taps on the unit."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (1, 16, 20, 20)).astype(np.uint8)
    w = rng.integers(-128, 128, (32, 16, 3, 3)).astype(np.int8)
    sevens = Tensor(np.full(x.shape, 7, np.uint8), device="cpu")
    result = Tensor(x, device="cpu").maximum(sevens).cast(int32).conv2d(
        Tensor(w, device="cpu").cast(int32), stride=2)
    (kernel,) = result.schedule()
    assert any(n.op is Op.MMA and n.arg == DPBUSD for n in kernel.nodes)
    assert sum(n.op is Op.LOCAL for n in kernel.nodes) == 3
    import torch

    exact = torch.nn.functional.conv2d(torch.tensor(np.maximum(x, 7), dtype=torch.float64),
                                       torch.tensor(w, dtype=torch.float64), stride=2).numpy()
    np.testing.assert_array_equal(result.numpy(), exact.astype(np.int64))


@needs_bf16
def test_a_bfloat16_conv_runs_on_the_unit_within_rounding():
    """Taps on vdpbf16ps: the unit's two k terms are two channels at one tap."""
    import torch

    rng = np.random.default_rng(4)
    x, w = _bf16(rng, (1, 16, 12, 12)), _bf16(rng, (32, 16, 3, 3))
    result = Tensor(x, device="cpu").conv2d(Tensor(w, device="cpu"), padding=1)
    assert any(n.op is Op.MMA and n.arg == DPBF16 for k in result.schedule() for n in k.nodes)
    exact = torch.nn.functional.conv2d(torch.tensor(x.astype(np.float64)),
                                       torch.tensor(w.astype(np.float64)), padding=1).numpy()
    sizes = torch.nn.functional.conv2d(torch.tensor(np.abs(x.astype(np.float64))),
                                       torch.tensor(np.abs(w.astype(np.float64))),
                                       padding=1).numpy()
    # float32 sums (144 terms, well within 2^-16 of the sum of sizes), then half an ULP of
    # bfloat16 on the result
    bound = sizes * 2.0 ** -16 + (np.abs(exact) + sizes * 2.0 ** -16) * 2.0 ** -8
    assert (np.abs(result.numpy().astype(np.float64) - exact) <= bound).all()
