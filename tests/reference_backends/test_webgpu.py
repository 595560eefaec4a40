"""What is specific to the WebGPU backend: its WGSL (packed small types, baked workgroup size,
NaN tests on bits), what it reads from the adapter, its limits and its failure messages. Every
op x dtype, the kernel tier and the Tensor ops run on it through the shared, backend-
parametrized suites (tests/abi, tests/stack).

Here the adapter is Mesa's lavapipe (Vulkan on the CPU); a machine without one skips the tests
that need a device, and still runs the rendering and error-path tests.
"""
from __future__ import annotations

import numpy as np
import pytest

from portkit import runtime
from portkit.abi import BackendUnavailable, CapabilityError, KernelBuilder, Op, dtypes
from portkit.abi.errors import CompileError
from portkit.abi.interpreter import run as interpret
from portkit.reference_backends import webgpu
from portkit.reference_backends.webgpu.device import find_device
from portkit.reference_backends.webgpu.renderer import WebGPURenderer


@pytest.fixture(scope="module")
def rt():
    try:
        return runtime.get("webgpu")
    except BackendUnavailable as error:
        pytest.skip(f"no WebGPU adapter here: {error}")


def copy_kernel(dtype, grid=(1, 1, 1), block=(8, 1, 1), gate=False):
    """out[i] = a[i] (or 0 where i is odd, with `gate`), one element per thread."""
    k = KernelBuilder(f"copy_{dtype.name}")
    a, out = k.param(dtype), k.param(dtype)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group"), k.const(block[0])), k.special("local"))
    even = k.alu(Op.CMPNE, k.alu(Op.AND, i, k.const(1)), k.const(1))
    k.store(out, i, k.load(a, i, even if gate else None))
    return k.build(grid, block)


def test_small_types_are_packed_in_words_and_stored_with_atomics():
    source = WebGPURenderer().render(copy_kernel(dtypes.int8))
    assert "var<storage, read_write> data1: array<atomic<u32>>;" in source
    assert "atomicAnd(&data1[u32(v" in source and "atomicOr(&data1[" in source
    assert "<< 24u) >> 24u)" in source        # loads sign-extend int8
    assert "@workgroup_size(8, 1, 1)" in source and "enable f16" not in source


def test_f16_is_enabled_only_when_used_and_nan_is_tested_on_bits():
    k = KernelBuilder("max16")
    a = k.param(dtypes.float16)
    k.store(a, k.const(0), k.alu(Op.MAX, k.load(a, k.const(0)), k.load(a, k.const(1))))
    source = WebGPURenderer().render(k.build())
    assert source.startswith("enable f16;") and "array<f16>" in source
    assert "pk_isnan(f32(v" in source and "!= v" not in source


def test_scalars_come_in_a_uniform_struct():
    k = KernelBuilder("scale")
    out, n = k.param(dtypes.int32), k.var("n")
    k.store(out, k.special("local"), k.alu(Op.MUL, k.special("local"), n))
    source = WebGPURenderer().render(k.build(block=(4, 1, 1)))
    assert "@binding(1) var<uniform> pk_vars: PkVars;" in source
    assert "let var_n: i32 = pk_vars.s0;" in source


def test_capabilities_come_from_the_adapter(rt):
    caps, limits = rt.capabilities, find_device().limits
    assert caps.max_buffers == limits["max-storage-buffers-per-shader-stage"]
    assert caps.local_memory_bytes == limits["max-compute-workgroup-storage-size"]
    assert caps.max_grid == (limits["max-compute-workgroups-per-dimension"],) * 3
    assert not {dtypes.int64, dtypes.uint64, dtypes.float64} & caps.dtypes
    assert {dtypes.bool_, dtypes.int8, dtypes.uint16, dtypes.bfloat16} <= caps.dtypes
    assert not {Op.SIN, Op.EXP2, Op.LOG2} & caps.ops      # decomposed by codegen


@pytest.mark.parametrize("dtype", [dtypes.bool_, dtypes.int8, dtypes.uint16, dtypes.bfloat16])
def test_neighbouring_packed_elements_survive_stores_from_other_threads(rt, dtype):
    # 3 workgroups of 5 threads: words are shared across threads and across workgroups.
    kernel = copy_kernel(dtype, grid=(3, 1, 1), block=(5, 1, 1), gate=True)
    a = np.random.default_rng(0).integers(1, 100, 15).astype(dtype.np)
    out = np.full(15, 7).astype(dtype.np)
    expected = [a.copy(), out.copy()]
    interpret(kernel, expected)
    np.testing.assert_array_equal(rt.run(kernel, a, out)[1], expected[1])


def test_odd_sized_buffers_round_trip(rt):
    data = np.arange(7, dtype=np.uint8)
    assert rt.alloc(dtypes.uint8, 7).copyin(data).numpy().tolist() == data.tolist()
    assert rt.alloc(dtypes.uint8, 0).copyin(data[:0]).numpy().size == 0


def test_more_buffers_than_the_adapter_binds_are_refused(rt):
    k = KernelBuilder("many")
    params = [k.param(dtypes.float32) for _ in range(rt.capabilities.max_buffers + 1)]
    k.store(params[0], k.const(0), k.load(params[-1], k.const(0)))
    with pytest.raises(CapabilityError, match="buffers exceed the limit"):
        rt.compile(k.build())


def test_invalid_wgsl_is_a_compile_error_with_the_log(rt):
    with pytest.raises(CompileError) as error:
        rt.device.compiler.compile("fn broken( {")
    assert "expected" in error.value.log and error.value.source == "fn broken( {"


def test_no_adapter_names_the_driver_package(monkeypatch):
    wgpu = pytest.importorskip("wgpu")
    monkeypatch.setattr(wgpu.gpu, "request_adapter_sync", lambda **options: None)
    with pytest.raises(BackendUnavailable) as error:
        webgpu.backend.load()
    assert error.value.fix == "apt-get install mesa-vulkan-drivers"
    assert "no WebGPU adapter" in error.value.reason


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_division_by_a_constant_zero_is_ieee(rt, dtype):
    # lavapipe dropped the store of `x / 0.0f` (the output kept a freed buffer's contents) and
    # read `-0.0f` as +0.
    from portkit import Tensor
    x = Tensor([1.0, -1.0, 0.0, 3.0], device="webgpu", dtype=dtype)
    np.testing.assert_array_equal((x / 0.0).numpy().astype(np.float32), [np.inf, -np.inf,
                                                                         np.nan, np.inf])
    np.testing.assert_array_equal((x / -0.0).numpy().astype(np.float32), [-np.inf, np.inf,
                                                                          np.nan, -np.inf])
    zeros = Tensor([0.0, -0.0, 0.0, 0.0], device="webgpu", dtype=dtype)
    np.testing.assert_array_equal((x / zeros).numpy().astype(np.float32), [np.inf, np.inf,
                                                                           np.nan, np.inf])


def test_a_process_leaves_no_runtime_folder_behind(tmp_path):
    # Each process used to leave an empty portkit-xdg-* folder in the temporary directory.
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["TMPDIR"] = str(tmp_path)
    code = ("import os, portkit.reference_backends.webgpu.runtime as r; "
            "print(os.environ['XDG_RUNTIME_DIR'])")
    made = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert made.startswith(str(tmp_path)) and list(tmp_path.iterdir()) == []
