"""Reductions longer than a float32 lane or a driver's loop budget stay right (issue 11, 1-2).

A float32 accumulator stops growing at 2**24, and lavapipe stops every shader after 65,535 loop
iterations in all; the scheduler cuts every reduce into stages of at most stages.CHUNK
elements per output, so neither limit is ever reached.
"""
from __future__ import annotations

import numpy as np
import pytest

from portkit import Tensor, runtime, schedule
from portkit.abi import BackendUnavailable, Op
from portkit.schedule import stages


def _device(name: str) -> str:
    try:
        runtime.get(name)
    except BackendUnavailable as error:
        pytest.skip(f"{name} is not available here: {error}")
    return name


def _longest_loop(kernels) -> int:
    longest = 0
    for kernel in kernels:
        for node in kernel.nodes:
            if node.op is Op.RANGE:
                lo, hi = (kernel.nodes[s] for s in node.src)
                if lo.op is Op.CONST and hi.op is Op.CONST:
                    longest = max(longest, hi.arg - lo.arg)
    return longest


@pytest.mark.parametrize("shape, axis", [((70001,), None), ((3, 65537), 1), ((20_000_001,), None),
                                         ((300, 300), None), ((2, 70001), 1)])
def test_no_reduce_loop_is_longer_than_a_chunk(shape, axis):
    x = Tensor.ones(*shape, device="interpreter")
    kernels = schedule.kernels([(x.sum() if axis is None else x.sum(axis)).lazy])
    assert len(kernels) >= 2
    assert 0 < _longest_loop(kernels) <= stages.CHUNK


@pytest.mark.parametrize("device", ["cpu", "opencl"])
def test_a_float32_sum_past_2_to_the_24_is_exact(device):
    device = _device(device)
    assert Tensor.ones(20_000_001, device=device).sum().numpy() == np.float32(20_000_001)
    assert Tensor.full((20_000_001,), 0.5, device=device).mean().numpy() == 0.5


@pytest.mark.parametrize("device", ["cpu", "webgpu", "opencl"])
def test_reduces_past_65535_iterations(device):
    device = _device(device)
    assert Tensor.ones(70001, device=device).sum().numpy() == 70001
    np.testing.assert_array_equal(Tensor.ones(3, 65537, device=device).sum(1).numpy(),
                                  [65537] * 3)
    values = -np.arange(70001, dtype=np.float32)[::-1] - 1      # the max is the last element
    assert Tensor(values, device=device).max().numpy() == -1
    assert Tensor(values, device=device).argmax().numpy() == 70000
    a = np.ones((2, 70001), np.float32)
    b = np.ones((70001, 3), np.float32)
    np.testing.assert_array_equal((Tensor(a, device=device) @ Tensor(b, device=device)).numpy(),
                                  np.full((2, 3), 70001, np.float32))
