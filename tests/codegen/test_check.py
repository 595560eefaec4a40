"""PORTKIT_CHECK=1 runs each kernel's bounds-checked build (codegen/check.py) natively: an
out-of-range LOAD or STORE is skipped and raises OutOfBoundsError naming it (issue 11, 3)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import runtime
from portkit.abi import BackendUnavailable, KernelBuilder, Op, dtypes
from portkit.abi.interpreter import run as interpret
from portkit.codegen.check import bounds_checked
from portkit.tensor import Tensor

DEVICES = ["cpu", "interpreter", "opencl", "webgpu"]


def _runtime(name: str) -> runtime.Runtime:
    try:
        return runtime.get(name)
    except BackendUnavailable as error:
        pytest.skip(f"{name} is not available here: {error}")


def _store_at_group(grid: int):
    k = KernelBuilder("store_at_group")
    out = k.param(dtypes.float32)
    k.store(out, k.special("group", 0), k.const(1.0, dtypes.float32))
    return k.build(grid=(grid, 1, 1))


def _load_shifted(grid: int, shift: int):
    """out[i] = x[i + shift] + 1."""
    k = KernelBuilder("load_shifted")
    out, x = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.special("group", 0)
    value = k.load(x, k.alu(Op.ADD, i, k.const(shift)))
    k.store(out, i, k.alu(Op.ADD, value, k.const(1.0, dtypes.float32)))
    return k.build(grid=(grid, 1, 1))


def _gated_load():
    """out[i] = i < 4 ? x[i] : 0, so threads 4..7 index past x but never access it."""
    k = KernelBuilder("gated_load")
    out, x = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.special("group", 0)
    k.store(out, i, k.load(x, i, k.alu(Op.CMPLT, i, k.const(4))))
    return k.build(grid=(8, 1, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_of_bounds_store_is_caught_and_not_performed(monkeypatch, device):
    rt = _runtime(device)
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    buffer = rt.alloc(dtypes.float32, 16).copyin(np.zeros(16, np.float32))
    guard = rt.alloc(dtypes.float32, 16).copyin(np.full(16, 7.0, np.float32))
    with pytest.raises(runtime.OutOfBoundsError, match=r"kernel 'store_at_group': node \d+ "
                       r"\(STORE\) accesses element 1[6-9] of a 16-element PARAM \(buffer 0\)"
                       r".*\[16\] elements"):
        rt.launch(rt.compile(_store_at_group(20)), [buffer])
    np.testing.assert_array_equal(buffer.numpy(), np.ones(16, np.float32))
    np.testing.assert_array_equal(guard.numpy(), np.full(16, 7.0, np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_an_out_of_bounds_load_is_caught(monkeypatch, device):
    rt = _runtime(device)
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(runtime.OutOfBoundsError, match=r"load_shifted.*\(LOAD\) accesses "
                       r"element [67] of a 6-element PARAM \(buffer 1\)"):
        rt.run(_load_shifted(5, 2), np.zeros(5, np.float32), x)
    with pytest.raises(runtime.OutOfBoundsError, match=r"element -[12] of a 6-element"):
        rt.run(_load_shifted(5, -2), np.zeros(5, np.float32), x)


@pytest.mark.parametrize("device", DEVICES)
def test_correct_kernels_give_the_same_results_checked_and_unchecked(monkeypatch, device):
    rt = _runtime(device)
    x = np.arange(6, dtype=np.float32)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((9, 33), np.float32), rng.standard_normal((33, 5), np.float32)

    def work():
        shifted = rt.run(_load_shifted(4, 2), np.zeros(4, np.float32), x)[0]
        gated = rt.run(_gated_load(), np.full(8, 9.0, np.float32), x[:4])[0]
        ta, tb = Tensor(a, device=device), Tensor(b, device=device)
        model = ((ta @ tb).relu().softmax(-1) * 3).sum(0).numpy()
        return shifted, gated, model

    unchecked = work()
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    checked = work()
    np.testing.assert_array_equal(checked[0], x[2:6] + 1)
    np.testing.assert_array_equal(checked[1], [0, 1, 2, 3, 0, 0, 0, 0])
    for got, want in zip(checked, unchecked):
        np.testing.assert_array_equal(got, want)


def test_local_memory_is_checked_against_its_size():
    k = KernelBuilder("local_past_end")
    out = k.param(dtypes.int32)
    scratch = k.local(dtypes.int32, 4)
    t = k.special("local", 0)
    k.store(scratch, t, t)
    k.barrier()
    k.store(out, t, k.load(scratch, t))
    checked = bounds_checked(k.build(block=(6, 1, 1)))
    buffers = [np.zeros(6, np.int32), np.zeros(checked.fault_words, np.int32)]
    interpret(checked.kernel, buffers, [6])
    fault = checked.fault(buffers[1], [6])
    assert (fault.buffer, fault.size, fault.op, fault.others) == (None, 4, Op.STORE, 1)
    assert fault.index in (4, 5)
    np.testing.assert_array_equal(buffers[0], [0, 1, 2, 3, 0, 0])


def test_the_checked_build_takes_sizes_first_and_a_fault_buffer_last():
    k = KernelBuilder("with_scalars")
    out = k.param(dtypes.float32)
    k.var("pk_size0")                            # a name the pass must not reuse
    scale = k.var("scale", dtypes.float32)
    k.store(out, k.special("group", 0), scale)
    checked = bounds_checked(k.build(grid=(2, 1, 1)))
    assert checked.kernel.vars == ("pk_size0_", "pk_size0", "scale")
    assert [p.dtype for p in checked.kernel.params] == [dtypes.float32, dtypes.int32]
    assert checked.fault_words == 2 and checked.accesses == (4,)


def test_too_many_buffers_for_a_fault_buffer_falls_back_to_the_interpreter(monkeypatch):
    cpu = _runtime("cpu")
    caps = dataclasses.replace(cpu.capabilities, max_buffers=2)
    rt = runtime.Runtime("cpu-two-buffers", dataclasses.replace(cpu.device, capabilities=caps))
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    with pytest.raises(runtime.OutOfBoundsError, match=r"lane 4 accesses element 6 of a "
                       r"6-element PARAM.*PORTKIT_CHECK stopped the launch"):
        rt.run(_load_shifted(6, 2), np.zeros(6, np.float32), np.zeros(6, np.float32))


def test_portkit_check_interpreter_checks_before_the_launch(monkeypatch):
    rt = _runtime("cpu")
    monkeypatch.setenv("PORTKIT_CHECK", "interpreter")
    with pytest.raises(runtime.OutOfBoundsError, match=r"lane 16 accesses element 16 of a "
                       r"16-element PARAM.*PORTKIT_CHECK stopped the launch"):
        rt.run(_store_at_group(20), np.zeros(16, np.float32))
    monkeypatch.setenv("PORTKIT_CHECK", "sometimes")
    with pytest.raises(ValueError, match="PORTKIT_CHECK='sometimes' is not a mode"):
        rt.run(_store_at_group(16), np.zeros(16, np.float32))


@pytest.mark.parametrize("language", ["cuda", "metal"])
def test_the_checked_build_runs_on_the_cuda_and_metal_host_shims(monkeypatch, language):
    from portkit.conformance.shims import shim_device

    try:
        rt = runtime.Runtime(f"{language}-check-shim", shim_device(language))
    except BackendUnavailable as error:      # no clang++ here
        pytest.skip(str(error))
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    with pytest.raises(runtime.OutOfBoundsError, match=r"store_at_group.*of a 16-element"):
        rt.run(_store_at_group(20), np.zeros(16, np.float32))
    (ok,) = rt.run(_store_at_group(16), np.zeros(16, np.float32))
    np.testing.assert_array_equal(ok, np.ones(16, np.float32))


def test_the_checked_build_compiles_with_nvrtc():
    from portkit.reference_backends.cuda import runtime as cuda_runtime
    from portkit.reference_backends.cuda.renderer import CUDARenderer

    source = CUDARenderer().render(bounds_checked(_load_shifted(5, 2)).kernel)
    assert "var_pk_size1" in source
    try:
        cuda_runtime.nvrtc()
    except BackendUnavailable as error:
        pytest.skip(f"NVRTC is not available here: {error}")
    binary = cuda_runtime.CUDACompiler("sm_80").compile(source)
    assert b"k_load_shifted" in binary
