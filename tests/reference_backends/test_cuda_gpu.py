"""The CUDA backend on a real GPU: memory, launches, batches, timing, threads and exit.

These run only where `portkit backends` shows cuda available (an NVIDIA GPU and its driver);
elsewhere the module is skipped with the reason. `scripts/gpu-check.sh` runs them on a GPU
machine beside the full CUDA conformance; CI has no GPU, so there they do not run.
"""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from portkit import runtime
from portkit.abi import BackendUnavailable, KernelBuilder, Op, dtypes
from portkit.reference_backends.cuda.runtime import CUDAGraph
from portkit.tensor import Tensor

try:
    DEVICE = runtime.get("cuda")
except BackendUnavailable as error:
    pytest.skip(f"needs an NVIDIA GPU: {error}", allow_module_level=True)


def test_copies_round_trip_from_zero_bytes_to_256_mib():
    for size in (0, 1, 4097, 64 << 20):
        data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
        assert np.array_equal(Tensor(data, device="cuda").numpy(), data)


def test_ops_agree_with_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((257, 129), np.float32), rng.standard_normal((129, 65), np.float32)
    np.testing.assert_allclose((Tensor(a, device="cuda") @ Tensor(b, device="cuda")).numpy(),
                               a @ b, rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((33, 70001), np.float32)
    np.testing.assert_allclose(Tensor(x, device="cuda").sum(1).numpy(), x.sum(1, dtype=np.float64),
                               rtol=1e-4, atol=1e-2)
    half = rng.standard_normal(1000).astype(np.float16)
    np.testing.assert_array_equal((Tensor(half, device="cuda") * 2).numpy(), half * 2)


def test_wait_times_the_kernel_on_the_gpu():
    k = KernelBuilder("double")
    x, out = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(256)), k.special("local", 0))
    k.store(out, i, k.alu(Op.ADD, k.load(x, i), k.load(x, i)))
    compiled = DEVICE.compile(k.build(grid=(4096, 1, 1), block=(256, 1, 1)))
    source = DEVICE.alloc(dtypes.float32, 1 << 20).copyin(np.arange(1 << 20, dtype=np.float32))
    result = DEVICE.alloc(dtypes.float32, 1 << 20)
    seconds = DEVICE.launch(compiled, [source, result], wait=True)
    assert 0 < seconds < 1
    np.testing.assert_array_equal(result.numpy(), 2 * np.arange(1 << 20, dtype=np.float32))


def test_a_batch_runs_as_one_graph():
    # out = x * a + b, the second launch reading the first's output; then a replay that
    # replaces the second launch's output buffer and scalars.
    k = KernelBuilder("batch_axpb")
    out, x = k.param(dtypes.int32), k.param(dtypes.int32)
    i = k.special("group", 0)
    k.store(out, i, k.alu(Op.ADD, k.alu(Op.MUL, k.load(x, i), k.var("a")), k.var("b")))
    compiled = DEVICE.compile(k.build(grid=(4, 1, 1)))
    x0 = np.array([1, -2, 3, 40], np.int32)
    source, middle, last, other = (DEVICE.alloc(dtypes.int32, 4) for _ in range(4))
    source.copyin(x0)
    batch = DEVICE.batch([(compiled, [middle.handle, source.handle], [3, 1]),
                          (compiled, [last.handle, middle.handle], [-2, 5])])
    assert isinstance(batch, CUDAGraph)
    assert 0 < batch(wait=True) < 1
    np.testing.assert_array_equal(last.numpy(), (x0 * 3 + 1) * -2 + 5)
    DEVICE.run_batch(batch, [(1, 0, other.handle)], [(1, [7, 0])], [compiled.kernel] * 2)
    np.testing.assert_array_equal(other.numpy(), (x0 * 3 + 1) * 7)


def test_threads_each_get_the_context():
    results = {}

    def work(i: int) -> None:
        results[i] = (Tensor(np.full(1000 + i, i, np.float32), device="cuda") * 2).sum().item()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: 2.0 * i * (1000 + i) for i in range(4)}


def test_exit_with_live_buffers_is_quiet():
    # Buffers freed while the interpreter shuts down printed one ImportError traceback each.
    code = ("from portkit.tensor import Tensor\n"
            "keep = [Tensor([1.0, 2.0], device='cuda') + i for i in range(5)]\n"
            "print(keep[-1].numpy())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
