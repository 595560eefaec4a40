"""The CUDA backend without a GPU: every conformance kernel (ABI-op, kernel, Tensor-op and model
tiers) through NVRTC (and the PTX path
through nvJitLink), the renderer's numerics through the host shim, and a clean 'no driver'.

Launching on a GPU cannot be tested here (no NVIDIA driver); docs/backends/cuda.md gives the
command to run on one.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from portkit import backends, runtime
from portkit.abi import BackendUnavailable, CompileError, KernelBuilder, Op, dtypes
from portkit.conformance import matrix_cases, suite
from portkit.conformance.case import Context, Status
from portkit.conformance.matrix_cases import mma_kernel
from portkit.conformance.shims import (
    conformance_kernels,
    run_conformance,
    shim_capabilities,
    shim_device,
    tensor_kernels,
)
from portkit.conformance.target import Target
from portkit.reference_backends import cuda
from portkit.reference_backends.cuda import runtime as cuda_runtime
from portkit.reference_backends.cuda.renderer import MMA_UNITS, CUDARenderer
from portkit.tensor import Tensor

BATCH = 120


@pytest.fixture(scope="module")
def shim():
    try:
        return shim_device("cuda")
    except BackendUnavailable as error:   # CI installs clang; a GPU machine may not have it
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def capabilities():
    # The NVRTC tests need no clang++, which a GPU machine may lack.
    return shim_capabilities("cuda")


@pytest.fixture(scope="module")
def kernels(capabilities):
    return conformance_kernels(capabilities)


def compile_all(sources: list[str], arch: str) -> list[str]:
    """Compiles every source for `arch`; returns one message per kernel NVRTC rejects."""
    compiler = cuda_runtime.CUDACompiler(arch)
    failures = []
    for start in range(0, len(sources), BATCH):
        chunk = sources[start:start + BATCH]
        try:
            compiler.compile_batch(chunk)     # one NVRTC program: ~20x faster than one by one
        except CompileError:
            for source in chunk:   # one by one, so the error names its kernel
                try:
                    compiler.compile(source)
                except CompileError as error:
                    name = re.search(r"void \S+ (k_\w+)\(", source).group(1)
                    failures.append(f"{name}:\n{error.log[:600]}")
    return failures


def test_every_conformance_kernel_compiles_to_a_cubin(kernels):
    # sm_75 is the oldest architecture NVRTC 13 builds for, sm_90 a current one; a cubin
    # means NVRTC's built-in assembler accepted the PTX too.
    sources = [CUDARenderer().render(k) for k in kernels]
    assert len(sources) > 400    # every op x dtype, every CAST/BITCAST pair, every kernel case
    for arch in ("sm_75", "sm_90"):
        failures = compile_all(sources, arch)
        assert not failures, f"{len(failures)} kernels fail for {arch}:\n" + "\n".join(failures)


def test_every_tensor_op_and_model_kernel_compiles_to_a_cubin(capabilities):
    # Tiers 4 and 5 as the stack lowers them for a many-threads device: matmuls, reductions,
    # softmax, convolutions, gathers, optimizer steps, every kernel forward and backward.
    sources = [CUDARenderer().render(k) for k in tensor_kernels(capabilities)]
    assert len(sources) > 150
    for arch in ("sm_75", "sm_90"):
        failures = compile_all(sources, arch)
        assert not failures, f"{len(failures)} kernels fail for {arch}:\n" + "\n".join(failures)


def test_ptx_for_a_newer_gpu_assembles_with_nvjitlink(kernels):
    # A GPU newer than NVRTC gets PTX and the driver assembles it; nvJitLink does the same here.
    sources = [CUDARenderer().render(k) for k in kernels[::3]]
    ptx = cuda_runtime.CUDACompiler("compute_75").compile_batch(sources)[0]
    assert ptx.startswith(b"//") and b".entry" in ptx
    assert cuda_runtime.assemble(ptx, "sm_90").startswith(b"\x7fELF")
    with pytest.raises(CompileError, match="nvJitLink") as info:
        cuda_runtime.assemble(ptx.replace(b"ret;", b"bogus;", 1), "sm_90")
    assert "bogus" in info.value.log


def test_host_shim_runs_conformance_like_the_cpu(shim):
    # Quick tiers 1-3: the CPU reference passes all 290 cases; so must the CUDA C. The shim
    # declares no matrix unit (the host cannot run mma.sync), so the MMA case is unsupported.
    report = run_conformance(shim, quick=True)
    failed = [f"{r.case.id}: {r.message}" for r in report.results
              if r.status.value != "passed" and r.case.id != "ops/MMA/none"]
    assert not failed, "\n".join(failed[:20])
    assert report.counts()["passed"] == len(report.results) - 1 >= 280


def test_renderer_writes_cuda(shim):
    k = KernelBuilder("axpy")
    x, y = k.param(dtypes.float32), k.param(dtypes.float32)
    n = k.var("n")
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(64)), k.special("local", 0))
    with k.branch(k.alu(Op.CMPLT, i, n)):
        value = k.alu(Op.MULACC, k.load(x, i), k.const(2.0, dtypes.float32), k.load(y, i))
        k.store(y, i, k.cast(k.cast(value, dtypes.int32, bitcast=True), dtypes.float32,
                             bitcast=True))
    kernel = k.build(grid=(4, 1, 1), block=(64, 1, 1))
    source = CUDARenderer().render(kernel)
    assert ('extern "C" __global__ void __launch_bounds__(64) k_axpy(float *data0, '
            'float *data1, const int32_t var_n)') in source
    assert "((int)blockIdx.x)" in source and "((int)threadIdx.x)" in source
    assert "fma(" in source and "pk_bitcast<int32_t>(" in source
    xs, ys = np.arange(256, dtype=np.float32), np.ones(256, np.float32)
    program = shim.program(kernel.name, shim.compiler.compile(source))
    buffers = [xs.view(np.uint8).copy(), ys.view(np.uint8).copy()]
    program(buffers, [200], kernel.grid, kernel.block)
    out = buffers[1].view(np.float32)
    assert (out[:200] == 2 * xs[:200] + 1).all() and (out[200:] == 1).all()


def test_compile_error_carries_the_nvrtc_log():
    with pytest.raises(CompileError) as info:
        cuda_runtime.CUDACompiler("sm_90").compile('extern "C" __global__ void k() { x; }')
    assert 'identifier "x" is undefined' in info.value.log and "void k()" in info.value.source


def test_architecture_follows_the_compute_capability():
    assert cuda_runtime.architecture_for((9, 0)) == "sm_90"
    assert cuda_runtime.architecture_for((99, 0)).startswith("compute_")   # PTX, driver JITs
    with pytest.raises(BackendUnavailable, match="compute capability"):
        cuda_runtime.architecture_for((3, 5))


def test_no_driver_is_backend_unavailable_not_a_traceback(monkeypatch, fake_backends):
    from cuda.bindings import driver

    def missing(flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via '
                           "system search")  # what cuda-bindings raises without libcuda

    monkeypatch.setattr(driver, "cuInit", missing)
    with pytest.raises(BackendUnavailable) as info:
        cuda.backend.load()
    assert info.value.reason == "no NVIDIA driver (libcuda) found"
    assert "install the NVIDIA driver" in info.value.fix
    fake_backends({"cuda": "portkit.reference_backends.cuda:backend"})
    assert backends.available()["cuda"].startswith("no NVIDIA driver (libcuda) found")


def test_tensor_cores_compile_for_ampere_and_hopper(capabilities):
    # Each declared mma.sync shape, as conformance's MMA case and as the stack lowers a float16
    # and a bfloat16 matmul for a device that declares it; NVRTC checks the inline PTX.
    declared = dataclasses.replace(capabilities, matrix_units=MMA_UNITS).validate("cuda")
    name = "cuda-tensor-core-probe"      # plans kernels for `declared`; runs nothing
    try:
        runtime.register(runtime.Runtime(name, dataclasses.replace(
            backends.load("interpreter"), name=name, capabilities=declared)))
    except ValueError:      # registered by an earlier run in this process
        pass
    kernels = [mma_kernel(unit, 2) for unit in MMA_UNITS]
    for dtype in (dtypes.float16, dtypes.bfloat16):
        x = Tensor(np.ones((24, 40), np.float32), device=name).cast(dtype)
        lowered = [k for k in (x @ x.T).schedule() if any(n.op is Op.MMA for n in k.nodes)]
        assert len(lowered) == 1, f"the {dtype.name} matmul did not use the tensor cores"
        kernels += lowered
    sources = [CUDARenderer().render(k) for k in kernels]
    assert all("mma.sync.aligned.m16n8k16.row.col.f32." in s for s in sources)
    for arch in ("sm_80", "sm_90"):
        failures = compile_all(sources, arch)
        assert not failures, f"{len(failures)} kernels fail for {arch}:\n" + "\n".join(failures)


def test_tensor_core_numerics_through_the_host_shim(shim):
    # The host build of pk_mma_* gathers the warp's registers and computes the PTX ISA's tile:
    # every MMA case passes only if the renderer packs each declared layout as the ISA says.
    declared = dataclasses.replace(shim.capabilities, matrix_units=MMA_UNITS)
    target = Target(dataclasses.replace(shim, capabilities=declared), "cuda-shim-tensor-cores")
    ctx = Context(declared, quick=True)
    cases = matrix_cases.cases(ctx) + matrix_cases.loop_cases(ctx)
    target.precompile([case.make().kernel for case in cases], jobs=2)
    outcomes = {case.id: suite.execute(target, case) for case in cases}
    failed = [f"{name}: {o.message}" for name, o in outcomes.items()
              if o.status is not Status.PASSED]
    assert len(outcomes) == 8 and not failed, "\n".join(failed)
