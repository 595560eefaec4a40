"""LOCAL tiling of matmuls (portkit/codegen/tiles.py): when it applies, what the kernel holds, and
that it computes what torch does on every backend with workgroup memory, at odd sizes too."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import runtime, schedule
from portkit.abi.ops import Op
from portkit.codegen import tiles
from portkit.codegen.lower import lower
from portkit.reference_backends.cuda.renderer import CUDARenderer
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.reference_backends.metal.renderer import MetalRenderer
from portkit.tensor import Tensor

CAPABILITIES = capabilities()

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)


def _item(x: np.ndarray, w: np.ndarray, transposed: bool = False):
    a, b = Tensor(x, device="interpreter"), Tensor(w, device="interpreter")
    item, = schedule.create_schedule([(a @ (b.T if transposed else b)).lazy])
    return item


def _ops(kernel) -> list[Op]:
    return [n.op for n in kernel.nodes]


def test_a_matmul_on_a_device_with_workgroup_memory_stages_through_local():
    item = _item(np.ones((70, 90), np.float32), np.ones((90, 50), np.float32))
    kernel = lower(item.root, item.inputs, CAPABILITIES)
    assert _ops(kernel).count(Op.LOCAL) == 2 and _ops(kernel).count(Op.BARRIER) == 2
    assert kernel.block[0] > 1
    CAPABILITIES.check_launch(kernel)


@pytest.mark.parametrize("change", [{"local_memory_bytes": 0}, {"threads_are_loops": True},
                                    {"max_block_threads": 1}])
def test_devices_without_workgroup_memory_or_lanes_are_not_tiled(change):
    caps = dataclasses.replace(CAPABILITIES, **change)
    item = _item(np.ones((70, 90), np.float32), np.ones((90, 50), np.float32))
    # (a device whose threads are loops may pack panels in LOCAL instead: codegen/pack.py)
    assert Op.BARRIER not in _ops(lower(item.root, item.inputs, caps))


def test_small_matmuls_and_plain_sums_are_not_tiled():
    small = _item(np.ones((4, 90), np.float32), np.ones((90, 50), np.float32))
    assert Op.LOCAL not in _ops(lower(small.root, small.inputs, CAPABILITIES))
    x = Tensor(np.ones((64, 64), np.float32), device="interpreter")
    item, = schedule.create_schedule([(x * x).sum(axis=1).lazy])
    assert Op.LOCAL not in _ops(lower(item.root, item.inputs, CAPABILITIES))


def test_a_tile_that_does_not_fit_the_device_is_not_used():
    caps = dataclasses.replace(CAPABILITIES, max_block_threads=64, max_block=(64, 64, 64),
                               local_memory_bytes=4096)
    item = _item(np.ones((128, 128), np.float32), np.ones((128, 128), np.float32))
    kernel = lower(item.root, item.inputs, caps)
    caps.check_launch(kernel)
    big = tiles.Tiling(16, 16, 4, 4, 16)
    assert not big.fits(caps, 4)
    assert lower(item.root, item.inputs, caps, local=big).block[0] <= 64


def test_float16_is_staged_and_accumulated_in_float32():
    item = _item(np.ones((64, 64), np.float16), np.ones((64, 64), np.float16))
    kernel = lower(item.root, item.inputs, CAPABILITIES)
    assert {n.dtype.name for n in kernel.nodes if n.op in (Op.LOCAL, Op.ACC)} == {"float32"}


@pytest.mark.parametrize("tiling", [tiles.CANDIDATES[0], tiles.Tiling(8, 8, 4, 4, 16),
                                    tiles.Tiling(4, 8, 2, 4, 8, True)])
@pytest.mark.parametrize("transposed", [False, True])
def test_every_tiling_computes_the_matmul_in_the_interpreter(tiling, transposed):
    x = RNG.standard_normal((37, 53)).astype(np.float32)
    w = RNG.standard_normal((29, 53) if transposed else (53, 29)).astype(np.float32)
    item = _item(x, w, transposed)
    kernel = lower(item.root, item.inputs, CAPABILITIES, local=tiling)
    assert Op.BARRIER in _ops(kernel)
    arrays = [np.zeros(37 * 29, np.float32)] + [
        (x if node.shape == x.shape else w).reshape(-1) for node in item.inputs]
    got = runtime.get("interpreter").run(kernel, *arrays)[0].reshape(37, 29)
    np.testing.assert_allclose(got, x @ (w.T if transposed else w), rtol=1e-5, atol=1e-5)


def _gpu_backends() -> list[str]:
    from tests.stack.conftest import BACKENDS

    return [name for name in BACKENDS
            if name == "interpreter" or (runtime.get(name).capabilities.local_memory_bytes
                                         and not runtime.get(name).capabilities.threads_are_loops)]


CASES = {
    "odd": ((37, 53), (53, 29), lambda x, w: x @ w),
    "square": ((64, 64), (64, 64), lambda x, w: x @ w),
    "batched": ((3, 37, 53), (3, 53, 29), lambda x, w: x @ w),
    "broadcast x @ W.T": ((3, 37, 53), (29, 53), lambda x, w: x @ w.T),
    "prologue": ((130, 70), (70, 200), lambda x, w: (x * 2 + 1) @ w),
}


@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("case", CASES)
def test_tiled_matmuls_agree_with_torch(backend, case):
    left, right, fn = CASES[case]
    x, w = (RNG.standard_normal(s).astype(np.float32) for s in (left, right))
    a, b = Tensor(x, device=backend), Tensor(w, device=backend)
    item, = schedule.create_schedule([fn(a, b).lazy])
    assert Op.LOCAL in _ops(schedule.lower_item(item)), "the case must exercise the tiling"
    expected = fn(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(fn(a, b).numpy(), expected, rtol=1e-4, atol=1e-4)


CONVS = {   # (x shape, weight shape, stride, padding)
    "3x3 on a 7 x 7 map": ((1, 32, 7, 7), (48, 32, 3, 3), 1, 1),
    "strided, odd map": ((2, 8, 9, 11), (24, 8, 3, 3), 2, 1),
    "5x5 on 13 x 13, batch 3": ((3, 4, 13, 13), (40, 4, 5, 5), 1, 2),
}


@pytest.mark.parametrize("backend", _gpu_backends())
@pytest.mark.parametrize("case", CONVS)
def test_a_convolution_is_tiled_with_its_rows_folded_onto_its_columns(backend, case):
    # a 7-wide map (m = 7) was not tiled at all; folded, m is the map's 49 positions
    xs, ws, stride, padding = CONVS[case]
    x, w = (RNG.standard_normal(s).astype(np.float32) for s in (xs, ws))
    a, b = Tensor(x, device=backend), Tensor(w, device=backend)
    item, = schedule.create_schedule([a.conv2d(b, stride=stride, padding=padding).lazy])
    kernel = schedule.lower_item(item)
    assert Op.LOCAL in _ops(kernel)
    found = tiles.find(item.root, item.inputs, runtime.get(backend).capabilities)
    assert found is not None and found.fold
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w),
                                          stride=stride, padding=padding).numpy()
    got = a.conv2d(b, stride=stride, padding=padding).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", _gpu_backends())
def test_a_float16_matmul_accumulates_in_float32(backend):
    if "float16" not in {d.name for d in runtime.get(backend).capabilities.dtypes}:
        pytest.skip(f"{backend} has no float16")
    # 512 terms of about 0.1: a float16 running sum would be off by about 1e-2 relative
    x = RNG.uniform(0.05, 0.15, (24, 512)).astype(np.float16)
    w = RNG.uniform(0.5, 1.5, (512, 40)).astype(np.float16)
    got = (Tensor(x, device=backend) @ Tensor(w, device=backend)).numpy().astype(np.float64)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=1e-3)


def test_cuda_and_metal_render_the_tiled_kernel():
    item = _item(np.ones((70, 90), np.float32), np.ones((90, 50), np.float32))
    kernel = lower(item.root, item.inputs, CAPABILITIES)
    assert "__syncthreads()" in CUDARenderer().render(kernel)
    assert "threadgroup_barrier" in MetalRenderer().render(kernel)


@pytest.mark.parametrize("backend", _gpu_backends())
def test_a_slice_of_a_matmul_fused_into_its_kernel_stays_in_bounds(backend, monkeypatch):
    # a shrink of the matmul's output is not a reshape: the tile must not store past it
    monkeypatch.setenv("PORTKIT_CHECK", "1")     # a store out of bounds raises
    x, w = RNG.standard_normal((40, 48)).astype(np.float32), \
        RNG.standard_normal((48, 36)).astype(np.float32)
    got = (Tensor(x, device=backend) @ Tensor(w, device=backend))[:17].numpy()
    np.testing.assert_allclose(got, (x @ w)[:17], rtol=1e-4, atol=1e-4)


def test_a_grid_past_the_devices_limit_is_not_tiled():
    # WebGPU allows 65535 groups per dimension: a tile must not ask for more
    caps = dataclasses.replace(CAPABILITIES, max_grid=(4, 65535, 65535))
    item = _item(np.ones((128, 128), np.float32), np.ones((128, 128), np.float32))
    kernel = lower(item.root, item.inputs, caps)
    caps.check_launch(kernel)


def test_a_sum_of_a_stored_product_is_no_contraction(monkeypatch):
    # a buffer computed as a product (an LSTM's gradient that several kernels read) and summed
    # by the next kernel: its factors lie behind the buffer, and analysing them walked the whole
    # unrealized graph before it (0.7 s for one sum in an LSTM's first training step on webgpu)
    from portkit.codegen import tune
    a, b = (Tensor(RNG.standard_normal(shape).astype(np.float32), device="interpreter")
            for shape in ((32, 1, 64), (1, 32, 64)))
    product = (a.sigmoid() * b.sigmoid())
    total = product.sum(axis=2)
    analysed = []
    real = tiles.load_steps
    monkeypatch.setattr(tiles, "load_steps", lambda node, *args: analysed.append(node) or real(
        node, *args))
    assert tune.contraction(total.lazy, [product.lazy], CAPABILITIES) is None
    assert not analysed, analysed
