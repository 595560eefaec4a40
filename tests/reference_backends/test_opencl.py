"""What is specific to the OpenCL backend: its OpenCL C, what it reads from the device, the
binary cache and its failure messages. Every op x dtype, the kernel tier and the Tensor ops run
on it through the shared, backend-parametrized suites (tests/abi, tests/stack).

On this machine the device is PoCL on the CPU (no cl_khr_fp16, so float16 is emulated); a
machine with no OpenCL driver skips the tests that need a device, and still runs the rest.
"""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import numpy as np
import pytest

from portkit import cache, runtime
from portkit.abi import BackendUnavailable, CompileError, KernelBuilder, Op, dtypes
from portkit.abi.interpreter import run as interpret
from portkit.reference_backends import opencl
from portkit.reference_backends.opencl.renderer import OpenCLRenderer


@pytest.fixture(scope="module")
def device():
    try:
        return opencl.backend.load()
    except BackendUnavailable as error:
        pytest.skip(f"no OpenCL device here: {error}")


def ids_kernel(grid, block):
    """Each thread writes group * 100 + local, per axis, to its own element."""
    k = KernelBuilder("ids")
    out = k.param(dtypes.int32)
    threads = block[0] * block[1] * block[2]
    flat = k.const(0)
    for axis, size in ((2, grid[2]), (1, grid[1]), (0, grid[0])):
        flat = k.alu(Op.ADD, k.alu(Op.MUL, flat, k.const(size)), k.special("group", axis))
    lid = k.alu(Op.ADD, k.alu(Op.MUL, k.special("local", 1), k.const(block[0])),
                k.special("local", 0))
    index = k.alu(Op.ADD, k.alu(Op.MUL, flat, k.const(threads)), lid)
    k.store(out, index, k.alu(Op.ADD, k.alu(Op.MUL, flat, k.const(100)), lid))
    return k.build(grid, block)


def test_source_turns_off_contraction_and_stores_bool_as_bytes():
    k = KernelBuilder("flags")
    a, out = k.param(dtypes.float32), k.param(dtypes.bool_)
    i = k.special("local")
    k.store(out, i, k.alu(Op.CMPLT, k.load(a, i), k.const(0.5, dtypes.float32)))
    source = OpenCLRenderer(fp16=False, fp64=True).render(k.build())
    assert source.startswith("#pragma OPENCL FP_CONTRACT OFF")
    assert "__global uchar *data1" in source and "cl_khr_fp64" in source
    assert "(int)get_local_id(0)" in source


def test_float16_is_native_only_with_cl_khr_fp16():
    k = KernelBuilder("half")
    a = k.param(dtypes.float16)
    k.store(a, k.const(0), k.alu(Op.ADD, k.load(a, k.const(0)), k.load(a, k.const(1))))
    emulated = OpenCLRenderer(fp16=False, fp64=False).render(k.build())
    native = OpenCLRenderer(fp16=True, fp64=False).render(k.build())
    assert "__global ushort *data0" in emulated and "pk_f16(" in emulated
    assert "float pk_round_odd(float x)" in emulated        # no double without cl_khr_fp64
    assert "__global half *data0" in native and "pk_f16(" not in native
    assert "cl_khr_fp16 : enable" in native


def exp2_kernel(dtype):
    k = KernelBuilder("exp2")
    a = k.param(dtype)
    i = k.special("local")
    k.store(a, i, k.alu(Op.EXP2, k.load(a, i)))
    return k.build((1, 1, 1), (64, 1, 1))


def test_exp2_on_float_is_inline_on_a_cpu_device_and_the_builtin_on_a_gpu():
    # PoCL's exp2 is a call that kept the loop around it scalar: a GELU over 1.2 million
    # floats took 60 ms, 5 ms with the inline polynomial
    on_cpu = OpenCLRenderer(fp16=False, fp64=True, cpu=True).render(exp2_kernel(dtypes.float32))
    on_gpu = OpenCLRenderer(fp16=False, fp64=True).render(exp2_kernel(dtypes.float32))
    assert "pk_exp2f(" in on_cpu and " exp2(" not in on_cpu.split("__kernel")[1]
    assert "pk_exp2f" not in on_gpu and "exp2(" in on_gpu
    wide = OpenCLRenderer(fp16=False, fp64=True, cpu=True).render(exp2_kernel(dtypes.float64))
    assert "pk_exp2f" not in wide


def test_inline_exp2_matches_the_oracle(device):
    values = np.concatenate([np.linspace(-160, 130, 61), [np.nan, np.inf, -np.inf, -0.0]])
    values = values.astype(np.float32)[:64]
    kernel = exp2_kernel(dtypes.float32)
    assert device.capabilities.threads_are_loops == ("pk_exp2f" in device.renderer.render(kernel))
    buffer = device.allocator.alloc(values.nbytes)
    device.allocator.copyin(buffer, memoryview(values.view(np.uint8)))
    program = device.program(kernel.name, device.compiler.compile(device.renderer.render(kernel)))
    program([buffer], [], (1, 1, 1), (64, 1, 1), wait=True)
    got = np.empty_like(values)
    device.allocator.copyout(memoryview(got.view(np.uint8)), buffer)
    with np.errstate(over="ignore"):
        want = np.exp2(values.astype(np.float64)).astype(np.float32)
    close = np.isclose(got, want, rtol=2.5e-7, atol=2e-45) | (got == want)   # 1 ulp
    assert (close | (np.isnan(got) & np.isnan(want))).all(), values[~close]


def test_capabilities_come_from_the_device(device):
    import pyopencl as cl

    caps = device.capabilities
    cl_device = device.compiler.device
    assert caps.max_block_threads == cl_device.max_work_group_size
    assert caps.local_memory_bytes == cl_device.local_mem_size
    assert (dtypes.float64 in caps.dtypes) == ("cl_khr_fp64" in cl_device.extensions)
    assert dtypes.float16 in caps.dtypes and dtypes.bfloat16 in caps.dtypes
    assert 2 <= caps.max_buffers <= cl_device.max_parameter_size // 8
    assert cl_device.name in caps.device_name
    assert isinstance(device.compiler.device, cl.Device)


@pytest.mark.parametrize("grid, block", [((3, 2, 1), (4, 2, 1)), ((5, 1, 1), (1, 1, 1))])
def test_grid_and_block_become_global_and_local_sizes(device, grid, block):
    kernel = ids_kernel(grid, block)
    total = int(np.prod(grid) * np.prod(block))
    buffer = device.allocator.alloc(4 * total)
    program = device.program(kernel.name, device.compiler.compile(
        device.renderer.render(kernel)))
    program([buffer], [], grid, block, wait=True)
    ours = np.zeros(total, np.int32)
    device.allocator.copyout(memoryview(ours.view(np.uint8)), buffer)
    expected = [np.zeros(total, np.int32)]
    interpret(kernel, expected)
    np.testing.assert_array_equal(ours, expected[0])


def test_binaries_are_cached_on_disk_and_load_without_the_source(device, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    kernel = ids_kernel((2, 1, 1), (8, 1, 1))
    source = device.renderer.render(kernel)
    binary = cache.compile_cached("opencl", device.compiler, source)
    (entry,) = (tmp_path / "opencl").glob("*.bin")
    assert entry.read_bytes().startswith(cache.MAGIC) and entry.read_bytes().endswith(binary)

    def no_compiler(source):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(device.compiler, "compile", no_compiler)
    assert cache.compile_cached("opencl", device.compiler, source) == binary
    program = device.program(kernel.name, binary)
    buffer = device.allocator.alloc(64)
    program([buffer], [], kernel.grid, kernel.block, wait=True)
    out = np.zeros(16, np.int32)
    device.allocator.copyout(memoryview(out.view(np.uint8)), buffer)
    np.testing.assert_array_equal(out, np.arange(16) % 8 + np.arange(16) // 8 * 100)


def test_zero_byte_buffers_and_timing(device):
    empty = device.allocator.alloc(0)
    device.allocator.copyin(empty, memoryview(b""))
    kernel = ids_kernel((1, 1, 1), (4, 1, 1))
    program = device.program(kernel.name, device.compiler.compile(
        device.renderer.render(kernel)))
    seconds = program([device.allocator.alloc(16)], [], kernel.grid, kernel.block, wait=True)
    assert 0 <= seconds < 10
    assert program([device.allocator.alloc(16)], [], kernel.grid, kernel.block) is None


def test_a_batch_holds_its_launches_until_the_last_is_queued(device, monkeypatch):
    """A batch's first launch waits on a user event that completes once every launch is
    queued: no launch starts while the host still queues (each woke the driver's workers for
    one kernel), and the chain still sees each launch's writes."""
    import pyopencl as cl

    from portkit.abi.backend import Launch

    k = KernelBuilder("plus_one")
    out, x = k.param(dtypes.int32), k.param(dtypes.int32)
    i = k.special("local", 0)
    k.store(out, i, k.alu(Op.ADD, k.load(x, i), k.const(1)))
    kernel = k.build(grid=(1, 1, 1), block=(8, 1, 1))
    program = device.program(kernel.name, device.compiler.compile(device.renderer.render(kernel)))
    buffers = [device.allocator.alloc(32) for _ in range(2)]
    device.allocator.copyin(buffers[0], memoryview(np.zeros(8, np.int32)).cast("B"))
    chain = [Launch(program, [buffers[(n + 1) % 2], buffers[n % 2]], [], kernel.grid,
                    kernel.block) for n in range(20)]
    batch = device.batch(chain)
    batch(wait=True)        # the first replay, which builds the work-group function
    queued, started = [], []
    real = cl.enqueue_nd_range_kernel

    def enqueue(queue, kernel, size, block, wait_for=None):
        if queued:
            status = queued[0].command_execution_status
            started.append(status <= cl.command_execution_status.RUNNING)
        queued.append(real(queue, kernel, size, block, wait_for=wait_for))
        if len(queued) == 1:
            time.sleep(0.05)      # time enough for a driver to start a launch it may start
        return queued[-1]
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", enqueue)
    batch(wait=True)
    assert len(queued) == 20 and not any(started), "a launch ran before the last was queued"
    got = np.zeros(8, np.int32)
    device.allocator.copyout(memoryview(got).cast("B"), buffers[0])
    np.testing.assert_array_equal(got, np.full(8, 40))


def test_compile_errors_carry_the_log(device):
    with pytest.raises(CompileError) as error:
        device.compiler.compile("__kernel void k_broken(__global int *a) { a[0] = b; }")
    assert "b" in error.value.log and "k_broken" in error.value.source


def test_missing_icd_names_the_driver_package(monkeypatch):
    cl = pytest.importorskip("pyopencl")

    def no_platforms():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", no_platforms)
    with pytest.raises(BackendUnavailable) as error:
        opencl.backend.load()
    assert "pocl-opencl-icd" in error.value.fix and "PLATFORM_NOT_FOUND" in error.value.reason


def test_a_kernel_with_a_10000_character_name_runs(device, tmp_path, monkeypatch):
    # PoCL asserted (SIGABRT) on a kernel name longer than its cache's file names allow.
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    k = KernelBuilder("x" * 10_000)
    out = k.param(dtypes.float32)
    k.store(out, k.special("group", 0), k.const(2.0, dtypes.float32))
    rt = runtime.Runtime("opencl-long-names", device)
    (result,) = rt.run(k.build(grid=(4, 1, 1), block=(1, 1, 1)), np.zeros(4, np.float32))
    np.testing.assert_array_equal(result, np.full(4, 2.0, np.float32))


def test_pocl_builds_hold_a_file_lock_beside_pocls_cache(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from portkit.reference_backends.opencl.runtime import POCL, driver_lock
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "kcache"))
    pocl = SimpleNamespace(platform=SimpleNamespace(name=POCL))
    assert driver_lock(pocl).lock_file == str(tmp_path / "kcache" / "portkit.lock")
    other = SimpleNamespace(platform=SimpleNamespace(name="NVIDIA CUDA"))
    assert not hasattr(driver_lock(other), "lock_file")


def test_a_build_waits_while_another_process_builds_in_pocls_cache(device):
    """PoCL 3.1 crashed (SIGSEGV reading program binaries, SIGABRT loading one) when two
    processes built into its cache at once, as two pytest-xdist workers did; builds now wait."""
    import threading
    import time

    from filelock import FileLock
    if device.compiler.device.platform.name != opencl.runtime.POCL:
        pytest.skip("the lock is only taken on PoCL")
    other = FileLock(device.compiler.lock.lock_file)   # another holder, as another process
    finished = []
    source = f"__kernel void k(__global int *a) {{ a[0] = {time.time_ns() % 1000003}; }}"
    builder = threading.Thread(
        target=lambda: finished.append((device.compiler.compile(source), time.monotonic())))
    with other:
        builder.start()
        builder.join(1.0)
        released = time.monotonic()
    builder.join(60)
    assert finished and finished[0][1] >= released and finished[0][0]


# -- a CPU device: work-items as loops, packed matmuls, vector accumulators ---------------------

def _device_info(kind: str) -> SimpleNamespace:
    """What capabilities() reads of a pyopencl Device, for a device of type `kind`."""
    cl = pytest.importorskip("pyopencl")
    return SimpleNamespace(
        extensions="cl_khr_fp64", double_fp_config=1, max_work_group_size=4096,
        single_fp_config=cl.device_fp_config.DENORM, max_work_item_sizes=[4096] * 3,
        local_mem_size=65536, max_parameter_size=1024, address_bits=64, name="fake",
        max_mem_alloc_size=1 << 30, max_compute_units=20,
        platform=SimpleNamespace(name="fake platform"), type=getattr(cl.device_type, kind))


def test_a_cpu_device_runs_work_items_as_loops_and_a_gpu_as_lanes():
    from portkit.reference_backends.opencl.capabilities import capabilities

    assert capabilities(_device_info("CPU")).threads_are_loops
    assert not capabilities(_device_info("GPU")).threads_are_loops
    assert not capabilities(_device_info("ACCELERATOR")).threads_are_loops
    assert capabilities(_device_info("GPU")).compute_units == 20   # codegen fills them


def test_a_register_block_is_held_in_opencl_vectors():
    """The 16 accumulators of a run are one float16 vector, updated by one fma of a broadcast
    scalar and a vload16 and stored by one vstore16; no double8 without fp64."""
    from tests.codegen.test_lanes import _kernel

    source = OpenCLRenderer(fp16=False, fp64=False).render(_kernel())
    lead = re.search(r"float16 (acc\d+) = \(float16\)\(", source).group(1)
    assert f"{lead} = fma((float16)(" in source and "vload16(0, &" in source
    assert f"vstore16({lead}, 0, &" in source and "double8" not in source
    assert source.count("fma(") == 1       # the whole run, once per iteration


def test_an_m1_products_partial_sums_are_opencl_vectors():
    """x @ W.T with one row (an LSTM step's h @ R.T) on a CPU device sums along k in runs of
    16 lanes, each a float16 updated by one multiply and one add of two vload16s, and the
    rows' trees are added side by side through .even/.odd: PoCL vectorizes across work-items,
    not within one, so written lane by lane the product ran 6-10x slower."""
    from tests.codegen.test_matvec import _kernel

    source = OpenCLRenderer(fp16=False, fp64=False).render(
        _kernel((1, 256), (1024, 256), transposed=True))
    assert not re.search(r"float acc\d+ = ", source)            # no scalar partial sum
    leads = re.findall(r"float16 (acc\d+) = \(float16\)\(", source)
    assert leads and all(f"{lead} = {lead} + vload16(0, &" in source for lead in leads)
    assert ".even" in source and ".odd" in source


def test_an_m1_product_on_opencl_matches_numpy(device):
    from portkit.tensor import Tensor

    rng = np.random.default_rng(5)
    x, w = rng.uniform(-1, 1, (1, 256)), rng.uniform(-1, 1, (1000, 256))
    got = (Tensor(x.astype(np.float32), device="opencl")
           @ Tensor(w.astype(np.float32), device="opencl").T).numpy()
    # 256 products and sums in float32: each may round, by half an ulp of the running sum
    error, bound = np.abs(got - x @ w.T), 256 * 2 ** -24 * (np.abs(x) @ np.abs(w.T))
    worst = np.unravel_index(error.argmax(), error.shape)
    assert (error <= bound).all(), f"{error[worst]:.3g} at {worst}, over {bound[worst]:.3g}"


@pytest.mark.parametrize("dtype, m, k, n, transposed", [
    (np.float32, 67, 300, 45, False),      # edges in m, n and k
    (np.float32, 64, 784, 512, True),      # x @ W.T, the MLP's first layer
    (np.float16, 33, 520, 40, False),      # summed in float32
])
def test_packed_matmuls_on_opencl_match_numpy(device, dtype, m, k, n, transposed):
    from portkit import schedule
    from portkit.codegen.lower import lower
    from portkit.tensor import Tensor

    rng = np.random.default_rng(m + k + n)
    a = rng.uniform(-1, 1, (m, k)).astype(dtype)
    b = rng.uniform(-1, 1, (n, k) if transposed else (k, n)).astype(dtype)
    x, y = Tensor(a, device="opencl"), Tensor(b, device="opencl")
    product = x @ (y.T if transposed else y)
    caps = runtime.get("opencl").capabilities
    if caps.threads_are_loops:      # PoCL: the packed lowering (panels in LOCAL), in vectors
        item, = schedule.create_schedule([product.lazy])
        source = device.renderer.render(lower(item.root, item.inputs, caps))
        # float16 panels hold float16 and the sums are float32: those lanes stay scalar
        assert "__local" in source and ("vload16" in source) == (dtype == np.float32)
    wide = a.astype(np.float64) @ (b.T if transposed else b).astype(np.float64)
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.T if transposed else b).astype(np.float64)
    error = np.abs(product.numpy().astype(np.float64) - wide)
    epsilon = 1e-3 if dtype == np.float16 else 1e-6     # one rounding of the output, and sums
    assert (error <= epsilon * bound + 1e-6).all()


@pytest.mark.parametrize("size", [64, 80])
def test_the_gpu_class_tiled_matmul_still_runs_on_an_opencl_driver(device, size):
    """PoCL takes the packed CPU lowering now; a GPU's OpenCL gets the LOCAL-tiled kernel with
    barriers (codegen/tiles.py). That kernel, rendered by this renderer, runs on PoCL's driver
    here: with the device's capabilities but work-items as lanes."""
    import dataclasses

    from portkit.conformance import tier6_perf
    from portkit.conformance.target import Target

    target = Target.load("opencl")
    caps = dataclasses.replace(target.capabilities, threads_are_loops=False)
    workload = tier6_perf.lowered_matmul(size, np.random.default_rng(size), caps)
    ops = {n.op for n in workload.kernel.nodes}
    assert Op.BARRIER in ops and Op.LOCAL in ops
    tier6_perf._verify(target, workload)        # CaseFailed names a wrong element
