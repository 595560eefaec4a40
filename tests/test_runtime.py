"""portkit.runtime: buffers, compile caches (memory and disk), launches, run, PORTKIT_DEBUG."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import backends, cache, runtime
from portkit.abi import CapabilityError, KernelBuilder, Op, dtypes
from portkit.abi.ops import COMPUTE
from portkit.runtime import LaunchError, Runtime


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("PORTKIT_DEBUG", raising=False)
    return tmp_path


def axpy(a: float = 2.0, name: str = "axpy", fused: bool = True):
    """y[i] = a * x[i] + y[i] where i < n (a scalar), over 16 elements; MULACC if `fused`."""
    k = KernelBuilder(name)
    x, y = k.param(dtypes.float32), k.param(dtypes.float32)
    n = k.var("n")
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(4)), k.special("local", 0))
    scale, xi, yi = k.const(a, dtypes.float32), k.load(x, i), k.load(y, i)
    value = (k.alu(Op.MULACC, scale, xi, yi) if fused
             else k.alu(Op.ADD, k.alu(Op.MUL, scale, xi), yi))
    k.store(y, i, value, k.alu(Op.CMPLT, i, n))
    return k.build(grid=(4, 1, 1), block=(4, 1, 1))


def test_get_is_cached_and_defaults_to_cpu(monkeypatch):
    monkeypatch.delenv("PORTKIT_DEVICE", raising=False)
    rt = runtime.get()
    assert rt is runtime.get("cpu") and rt.name == "cpu"
    assert rt.device is backends.load("cpu") and rt.capabilities is rt.device.capabilities
    monkeypatch.setenv("PORTKIT_DEVICE", "interpreter")
    assert runtime.get().name == "interpreter"


@pytest.mark.parametrize("dtype", [dtypes.bool_, dtypes.int8, dtypes.bfloat16, dtypes.float64],
                         ids=lambda d: d.name)
def test_buffer_round_trip(dtype):
    data = np.arange(7).astype(dtype.np)
    buffer = runtime.get("cpu").alloc(dtype, 7).copyin(data)
    assert (buffer.dtype, buffer.size, buffer.nbytes) == (dtype, 7, 7 * dtype.itemsize)
    np.testing.assert_array_equal(buffer.numpy(), data)
    with pytest.raises(LaunchError, match="astype"):
        buffer.copyin(np.zeros(7, np.int32 if dtype != dtypes.int32 else np.int64))
    with pytest.raises(LaunchError):
        buffer.copyin(np.zeros(8, dtype.np))


@pytest.mark.parametrize("name", [n for n in ("cpu", "interpreter", "opencl", "webgpu")
                                  if backends.available().get(n, "absent") is None])
def test_a_buffer_reads_back_its_first_elements_in_a_shape(name):
    # host memory (cpu, interpreter) is viewed in place; a device's is copied out first
    buffer = runtime.get(name).alloc(dtypes.int32, 6).copyin(np.arange(6, dtype=np.int32))
    np.testing.assert_array_equal(buffer.numpy((2, 2)), [[0, 1], [2, 3]])
    np.testing.assert_array_equal(buffer.numpy(()), 0)
    whole = buffer.numpy()
    whole[0] = 7                    # a copy: the buffer keeps its values
    np.testing.assert_array_equal(buffer.numpy((6,)), np.arange(6))


def test_run_uploads_launches_and_returns_every_param():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    y = np.ones((4, 4), np.float32)
    x_after, y_after = runtime.get("cpu").run(axpy(), x, y, scalars=(10,))
    np.testing.assert_array_equal(x_after, x)
    expected = np.where(np.arange(16).reshape(4, 4) < 10, 2 * x + 1, 1)
    np.testing.assert_array_equal(y_after, expected)
    assert y_after.shape == (4, 4)


def test_cpu_and_interpreter_agree():
    # Unfused: MULACC may round once or twice, and the two backends need not choose alike.
    kernel = axpy(0.1, fused=False)
    x, y = np.linspace(-3, 3, 16, dtype=np.float32), np.full(16, 0.25, np.float32)
    ours = runtime.get("cpu").run(kernel, x, y, scalars=(16,))
    theirs = runtime.get("interpreter").run(kernel, x, y, scalars=(16,))
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def test_compile_is_cached_in_memory_by_exact_kernel():
    rt = runtime.get("cpu")
    assert rt.compile(axpy()) is rt.compile(axpy())
    # -0.0 == 0.0 in Python, so Kernel equality would wrongly share these two programs
    assert rt.compile(axpy(0.0)) is not rt.compile(axpy(-0.0))
    assert "(-0.0f)" in rt.compile(axpy(-0.0)).source


def test_second_process_compile_hits_the_disk_cache(monkeypatch, cache_dir):
    device = backends.load("cpu")
    calls = []
    compile_source = device.compiler.compile
    monkeypatch.setattr(device.compiler, "compile",
                        lambda source: calls.append(source) or compile_source(source))
    kernel = axpy(3.0, "disk_cached")
    Runtime("cpu", device).compile(kernel)
    assert len(calls) == 1 and len(list((cache_dir / "cpu").glob("*.bin"))) == 1
    fresh = Runtime("cpu", device)          # a new in-memory cache, as in a new process
    _, y = fresh.run(kernel, np.ones(16, np.float32), np.zeros(16, np.float32), scalars=(16,))
    assert len(calls) == 1 and (y == 3).all()


def test_a_compiler_without_cache_key_is_not_cached(cache_dir):
    class Echo:
        cache_key = ""

        def compile(self, source: str) -> bytes:
            return source.encode()

    assert cache.compile_cached("echo", Echo(), "abc") == b"abc"
    assert not (cache_dir / "echo").exists()


def test_cache_writes_leave_no_temporary_files(cache_dir):
    path = cache_dir / "x" / "entry.bin"
    assert cache.write_atomic(path, b"one") and cache.write_atomic(path, b"two")
    assert path.read_bytes() == b"two" and [p.name for p in path.parent.iterdir()] == ["entry.bin"]


def test_ops_the_device_lacks_are_decomposed():
    device = backends.load("cpu")
    caps = dataclasses.replace(device.capabilities, ops=frozenset(COMPUTE) - {Op.MULACC})
    rt = Runtime("cpu", dataclasses.replace(device, capabilities=caps))
    compiled = rt.compile(axpy())
    assert Op.MULACC not in {n.op for n in compiled.kernel.nodes}
    _, y = rt.run(axpy(), np.arange(16, dtype=np.float32), np.ones(16, np.float32),
                  scalars=(16,))
    np.testing.assert_array_equal(y, 2 * np.arange(16) + 1)


def test_capabilities_are_checked_before_compiling():
    k = KernelBuilder("too_wide")
    k.store(k.param(dtypes.int32), k.special("local", 0), k.const(1))
    with pytest.raises(CapabilityError, match="block"):
        runtime.get("cpu").compile(k.build(block=(2048, 1, 1)))


def test_launch_checks_its_arguments():
    rt = runtime.get("cpu")
    compiled = rt.compile(axpy())
    x, y = rt.alloc(dtypes.float32, 16), rt.alloc(dtypes.float32, 16)
    with pytest.raises(LaunchError, match="scalars"):
        rt.launch(compiled, [x, y])
    with pytest.raises(LaunchError, match="must hold float32"):
        rt.launch(compiled, [x, rt.alloc(dtypes.int32, 16)], (16,))
    assert rt.launch(compiled, [x.copyin(np.ones(16, np.float32)),
                                y.copyin(np.zeros(16, np.float32))], (16,)) is None
    assert rt.launch(compiled, [x, y], (16,), wait=True) >= 0.0
    np.testing.assert_array_equal(y.numpy(), np.full(16, 4, np.float32))
    rt.synchronize()


def test_debug_output_by_level(monkeypatch, capsys):
    rt = runtime.get("cpu")
    x, y = rt.alloc(dtypes.float32, 16), rt.alloc(dtypes.float32, 16)
    monkeypatch.setenv("PORTKIT_DEBUG", "2")
    compiled = rt.compile(axpy(5.0, "debug_two"))
    rt.launch(compiled, [x, y], (0,))
    err = capsys.readouterr().err
    assert "debug_two" in err and "grid (4, 1, 1) block (4, 1, 1)" in err and " ms" in err
    assert "abi_version" not in err
    monkeypatch.setenv("PORTKIT_DEBUG", "4")
    compiled = rt.compile(axpy(5.0, "debug_four"))
    rt.launch(compiled, [x, y], (0,))
    rt.launch(compiled, [x, y], (0,))
    err = capsys.readouterr().err
    assert err.count("debug_four  ") == 2       # one line per launch
    assert err.count('"abi_version"') == 1 and err.count("pk_launch") == 1   # first launch only


def test_an_unwritable_cache_only_costs_a_recompile(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("PORTKIT_CACHE", str(blocked))
    _, y = Runtime("cpu", backends.load("cpu")).run(
        axpy(7.0, "uncached"), np.ones(16, np.float32), np.zeros(16, np.float32), scalars=(16,))
    assert (y == 7).all()


class _CountingAllocator:
    """Hands out fresh objects as handles and counts what it allocates and frees."""

    def __init__(self):
        self.allocated, self.freed = 0, 0

    def alloc(self, nbytes):
        self.allocated += 1
        return bytearray(nbytes)

    def free(self, handle, nbytes):
        self.freed += 1


def test_a_freed_buffer_returns_to_the_pool_and_is_reused():
    allocator = _CountingAllocator()
    pool = runtime.BufferPool(allocator)
    first = runtime.Buffer(pool, dtypes.float32, 4)
    handle = first.handle
    del first
    again = runtime.Buffer(pool, dtypes.float32, 4)
    assert again.handle is handle and allocator.allocated == 1
    other = runtime.Buffer(pool, dtypes.int8, 4)      # 4 bytes, not 16: a new allocation
    assert other.handle is not handle and allocator.allocated == 2


def test_the_pool_keeps_a_few_handles_per_size_and_frees_the_rest():
    allocator = _CountingAllocator()
    pool = runtime.BufferPool(allocator)
    buffers = [runtime.Buffer(pool, dtypes.float32, 2) for _ in range(pool.PER_SIZE + 3)]
    del buffers
    assert allocator.freed == 3
