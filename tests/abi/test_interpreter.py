"""The interpreter: lockstep lanes, masks for IF and loops, gated memory, LOCAL per workgroup,
bounds errors, and its use as a Device."""
import numpy as np
import pytest

from portkit.abi import KernelBuilder, Op, dtypes, interpreter
from portkit.conformance import Target

I32, F32 = dtypes.int32, dtypes.float32


def test_lanes_see_their_group_and_local_ids():
    b = KernelBuilder("ids")
    out = b.param(I32)
    g, t = b.special("group"), b.special("local")
    b.store(out, b.alu(Op.ADD, b.alu(Op.MUL, g, b.const(4)), t),
            b.alu(Op.ADD, b.alu(Op.MUL, g, b.const(100)), t))
    kernel = b.build(grid=(3, 1, 1), block=(4, 1, 1))
    buf = np.zeros(12, np.int32)
    interpreter.run(kernel, [buf])
    assert list(buf) == [100 * (i // 4) + i % 4 for i in range(12)]


def test_loops_with_per_lane_bounds_and_an_accumulator():
    b = KernelBuilder("triangle")
    out = b.param(I32)
    t = b.special("local")
    acc = b.acc(b.const(0))
    with b.loop(b.const(0), t) as k:       # lane t sums 0..t-1
        b.assign(acc, b.alu(Op.ADD, acc, k))
    b.store(out, t, acc)
    buf = np.zeros(6, np.int32)
    interpreter.run(b.build(block=(6, 1, 1)), [buf])
    assert list(buf) == [t * (t - 1) // 2 for t in range(6)]


def test_if_masks_stores_and_gates_make_loads_zero():
    b = KernelBuilder("gates")
    x, out = b.param(F32), b.param(F32)
    t = b.special("local")
    odd = b.alu(Op.CMPNE, b.alu(Op.AND, t, b.const(1)), b.const(0))
    with b.branch(odd):
        b.store(out, t, b.load(x, t))
    even = b.alu(Op.CMPNE, odd, b.const(True, dtypes.bool_))
    b.store(out, t, b.load(x, b.const(99), b.alu(Op.AND, even, odd)), even)
    buf = np.full(4, -1, np.float32)
    interpreter.run(b.build(block=(4, 1, 1)), [np.arange(1, 5, dtype=np.float32), buf])
    assert list(buf) == [0, 2, 0, 4]     # even lanes read through a false gate: 0, no error


def test_local_memory_is_private_to_each_workgroup_and_barriers_order_it():
    b = KernelBuilder("rotate")
    x, out = b.param(I32), b.param(I32)
    shared = b.local(I32, 4)
    g, t = b.special("group"), b.special("local")
    base = b.alu(Op.MUL, g, b.const(4))
    b.store(shared, t, b.load(x, b.alu(Op.ADD, base, t)))
    b.barrier()
    b.store(out, b.alu(Op.ADD, base, t),
            b.load(shared, b.alu(Op.MOD, b.alu(Op.ADD, t, b.const(1)), b.const(4))))
    buf = np.zeros(8, np.int32)
    interpreter.run(b.build(grid=(2, 1, 1), block=(4, 1, 1)), [np.arange(8, dtype=np.int32), buf])
    assert list(buf) == [1, 2, 3, 0, 5, 6, 7, 4]


def test_out_of_bounds_access_is_an_error_naming_the_lane():
    b = KernelBuilder("oob")
    out = b.param(I32)
    b.store(out, b.special("local"), b.const(1))
    with pytest.raises(interpreter.OutOfBounds, match="lane 3 accesses element 3 of a 3-element"):
        interpreter.run(b.build(block=(4, 1, 1)), [np.zeros(3, np.int32)])


def test_buffer_dtype_must_match_the_param():
    b = KernelBuilder("typed")
    b.store(b.param(F32), b.const(0), b.const(1.0, F32))
    with pytest.raises(TypeError, match="reads it as dtypes.float32"):
        interpreter.run(b.build(), [np.zeros(1, np.int32)])


def test_scalars_bind_to_vars_in_order():
    b = KernelBuilder("vars")
    out = b.param(I32)
    b.store(out, b.const(0), b.alu(Op.SUB, b.var("a"), b.var("b")))
    buf = np.zeros(1, np.int32)
    interpreter.run(b.build(), [buf], scalars=(10, 3))
    assert buf[0] == 7


def test_the_interpreter_device_runs_through_its_parts():
    target = Target.load("interpreter")
    b = KernelBuilder("twice")
    x, out = b.param(dtypes.bfloat16), b.param(dtypes.bfloat16)
    t = b.special("local")
    v = b.load(x, t)
    b.store(out, t, b.alu(Op.ADD, v, v))
    data = np.array([1.5, -2, 3, 0.25], dtypes.bfloat16.np)
    _, result = target.run(b.build(block=(4, 1, 1)), [data, np.zeros_like(data)])
    assert list(result.astype(np.float32)) == [3, -4, 6, 0.5]
    assert target.device.capabilities.validate("interpreter")
