"""Grids longer than Capabilities.max_grid allows fold over the axes a kernel leaves at 1
(codegen/grid.py, applied by Runtime.prepare): WebGPU and Vulkan take 65,535 groups per axis."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import backends, runtime
from portkit.abi import CapabilityError, Kernel, KernelBuilder, Op, dtypes
from portkit.abi.interpreter import run as interpret
from portkit.codegen.grid import fold_grid
from portkit.conformance import tier6_perf
from portkit.conformance.case import Context, Status
from portkit.conformance.target import Target
from portkit.tensor import Tensor

LIMIT = (1024, 65535, 65535)


def _device(base: str, name: str, **limits) -> runtime.Runtime:
    """Backend `base` registered as `name`, declaring `limits` instead of its own."""
    device = backends.load(base)
    caps = dataclasses.replace(device.capabilities, **limits)
    try:
        return runtime.register(runtime.Runtime(name, dataclasses.replace(
            device, name=name, capabilities=caps)))
    except ValueError:      # registered by an earlier test in this process
        return runtime.get(name)


def _add_one_in_place(groups: int, block: int, barrier: bool = False,
                      gated: bool = False) -> Kernel:
    """x[i] += 1 for one element per thread; with `barrier`, through LOCAL memory; with
    `gated`, a gate on the store leaves the last element alone."""
    b = KernelBuilder("add_one")
    x = b.param(dtypes.int32)
    local = b.special("local", 0)
    i = b.alu(Op.ADD, b.alu(Op.MUL, b.special("group", 0), b.const(block)), local)
    value = b.alu(Op.ADD, b.load(x, i), b.const(1))
    if barrier:
        tile = b.local(dtypes.int32, block)
        b.store(tile, local, value)
        b.barrier()
        value = b.load(tile, b.alu(Op.SUB, b.const(block - 1), local))
        i = b.alu(Op.ADD, b.alu(Op.MUL, b.special("group", 0), b.const(block)),
                  b.alu(Op.SUB, b.const(block - 1), local))
    gate = b.alu(Op.CMPLT, i, b.const(groups * block - 1)) if gated else None
    b.store(x, i, value, gate)
    return b.build(grid=(groups, 1, 1), block=(block, 1, 1))


@pytest.mark.parametrize("groups, folded", [(5000, (1000, 5, 1)), (1025, (513, 2, 1)),
                                            (1024 * 65535 + 1, (1024, 32768, 2))])
def test_a_long_grid_folds_over_the_free_axes(groups, folded):
    assert fold_grid(_add_one_in_place(groups, 1), LIMIT).grid == folded


@pytest.mark.parametrize("groups, barrier, gated", [(5000, False, False), (1025, False, False),
                                                    (1025, True, False), (1025, False, True)])
def test_a_folded_kernel_computes_what_the_long_one_does(groups, barrier, gated):
    # in place: a tail group that stored would add 1 twice to the last group's elements
    kernel = _add_one_in_place(groups, 2, barrier, gated)
    x = np.arange(2 * groups, dtype=np.int32)
    interpret(fold_grid(kernel, LIMIT), [x])
    expected = np.arange(2 * groups) + 1
    expected[-1] -= gated
    np.testing.assert_array_equal(x, expected)


def test_a_grid_that_cannot_fold_is_refused_naming_the_limit():
    b = KernelBuilder("square")
    b.store(b.param(dtypes.int32), b.special("group", 1), b.special("group", 0))
    kernel = b.build(grid=(2000, 2000, 1))
    with pytest.raises(CapabilityError, match=r"max_grid \(1024, 1024, 1\)"):
        fold_grid(kernel, (1024, 1024, 1))


@pytest.mark.parametrize("case", ["perf/copy", "perf/fused-elementwise"])
def test_tier6_bandwidth_cases_run_under_a_short_grid_limit(case):
    rt = _device("cpu", "cpu-grid-1024", max_grid=LIMIT)
    target = Target(rt.device, rt.name, rt)
    found, = [c for c in tier6_perf.cases(Context(rt.capabilities, quick=True)) if c.id == case]
    outcome = found.fn(target)      # checks every element before it times
    assert outcome.status is Status.PASSED, outcome.message


def test_the_stack_runs_long_elementwise_ops_and_reduces_under_a_short_grid_limit():
    # lowered as for a GPU (256 threads a group), so a 1M-element op wants 4096 groups
    rt = _device("cpu", "cpu-gpu-grid-1024", max_grid=LIMIT, threads_are_loops=False)
    x = np.random.default_rng(0).uniform(-1, 1, 1 << 20).astype(np.float32)
    t = Tensor(x, device=rt.name)
    np.testing.assert_allclose((t * 2 + 1).numpy(), x * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(t.sum().numpy(), x.astype(np.float64).sum(), atol=1e-2)
    np.testing.assert_allclose(t.reshape(16384, 64).amax(1).numpy(),
                               x.reshape(16384, 64).max(1))
