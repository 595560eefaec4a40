"""codegen.loops: a kernel with workgroup threads and barriers, run as one thread per group
that loops over the threads, gives the same buffers as the original (both in the interpreter)."""
import numpy as np
import pytest

from portkit.abi import KernelBuilder, dtypes, interpreter
from portkit.abi.ops import Op
from portkit.codegen.loops import threads_as_loops
from portkit.conformance.case import Context
from portkit.conformance.tier3_kernels import local_reverse, local_tree_sum


def _same_result(kernel, buffers, scalars=()):
    expected = [b.copy() for b in buffers]
    interpreter.run(kernel, expected, scalars)
    looped = threads_as_loops(kernel)
    assert looped.block == (1, 1, 1) and looped.grid == kernel.grid
    assert not any(n.op is Op.BARRIER for n in looped.nodes)
    assert not any(n.op is Op.SPECIAL and n.arg[0] == "local" for n in looped.nodes)
    actual = [b.copy() for b in buffers]
    interpreter.run(looped, actual, scalars)
    for want, got in zip(expected, actual):
        np.testing.assert_array_equal(got, want)
    return looped


@pytest.mark.parametrize("block", [1, 4, 32])
@pytest.mark.parametrize("build", [local_reverse, local_tree_sum])
def test_conformance_barrier_kernels(build, block):
    case = build(Context(capabilities=None), block)
    _same_result(case.kernel, case.inputs)


def test_values_and_accumulators_cross_barriers_per_thread():
    """A value made before a barrier, an ACC summed across a barrier loop, a 2-D block, and a
    loop bound computed in the kernel (uniform, so thread 0's is used)."""
    b = KernelBuilder("cross")
    out = b.param(dtypes.float32)
    shared = b.local(dtypes.float32, 12)
    x, y = b.special("local", 0), b.special("local", 1)
    flat = b.alu(Op.ADD, b.alu(Op.MUL, y, b.const(4)), x)
    value = b.cast(flat, dtypes.float32)
    acc = b.acc(b.const(0.5, dtypes.float32))
    steps = b.alu(Op.ADD, b.const(1), b.const(2))
    b.store(shared, flat, value)
    b.barrier()
    with b.loop(b.const(0), steps) as step:
        neighbour = b.alu(Op.MOD, b.alu(Op.ADD, flat, b.alu(Op.ADD, step, b.const(1))),
                          b.const(12))
        b.assign(acc, b.alu(Op.ADD, acc, b.load(shared, neighbour)))
        b.barrier()
        b.store(shared, flat, b.alu(Op.MUL, value, acc))
        b.barrier()
    group = b.special("group")
    b.store(out, b.alu(Op.ADD, b.alu(Op.MUL, group, b.const(12)), flat),
            b.alu(Op.ADD, acc, value))
    kernel = b.build(grid=(2, 1, 1), block=(4, 3, 1))
    looped = _same_result(kernel, [np.zeros(24, np.float32)])
    assert sum(n.op is Op.LOCAL for n in looped.nodes) >= 3   # shared, value, acc


def test_a_kernel_without_barriers_is_one_loop():
    b = KernelBuilder("plain")
    out = b.param(dtypes.int32)
    i = b.alu(Op.ADD, b.alu(Op.MUL, b.special("group"), b.const(8)), b.special("local"))
    with b.branch(b.alu(Op.CMPLT, i, b.const(13))):
        b.store(out, i, b.alu(Op.MUL, i, i))
    kernel = b.build(grid=(2, 1, 1), block=(8, 1, 1))
    looped = _same_result(kernel, [np.full(16, -1, np.int32)])
    assert sum(n.op is Op.RANGE for n in looped.nodes) == 1
    assert not any(n.op is Op.LOCAL for n in looped.nodes)
