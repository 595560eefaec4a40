"""codegen.llvm: the LLVM IR it writes keeps the ABI's rules for SSA targets (docs/abi.md), and a
kernel compiled with llvmlite and run on the host gives the interpreter's buffers; an MMA node
on a unit the renderer has no rendering for is refused with the fix."""
import ctypes

import llvmlite.binding as llvm
import numpy as np
import pytest

from portkit.abi import KernelBuilder, dtypes, interpreter
from portkit.abi.errors import CapabilityError
from portkit.abi.matrix import row_per_thread
from portkit.abi.ops import Op
from portkit.codegen.llvm import LLVMRenderer
from portkit.conformance.matrix_cases import mma_kernel

_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                           ctypes.c_int32, ctypes.c_int32)


def _machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return llvm.Target.from_default_triple().create_target_machine(opt=2)


def _run(kernel, buffers, scalars=()):
    """Renders, optimises and JIT-runs `kernel` on numpy `buffers` in place."""
    machine = _machine()
    module = llvm.parse_assembly(LLVMRenderer().render(kernel))
    module.verify()
    module.triple, module.data_layout = machine.triple, str(machine.target_data)
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(2))
    builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, _machine())
    engine.finalize_object()
    launch = _LAUNCH(engine.get_function_address("pk_launch"))
    pointers = (ctypes.c_void_p * len(buffers))(*(b.ctypes.data for b in buffers))
    words = (ctypes.c_int32 * max(len(scalars), 1))(*scalars)
    launch(pointers, words, *kernel.grid)


def _gated_kernel():
    b = KernelBuilder("gated")
    x, out = b.param(dtypes.float32), b.param(dtypes.float32)
    i = b.special("group")
    inside = b.alu(Op.CMPLT, i, b.const(3))
    value = b.load(x, i, inside)
    b.store(out, i, b.alu(Op.ADD, b.alu(Op.MUL, value, value), b.const(1.0, dtypes.float32)))
    return b.build(grid=(5, 1, 1))


def test_a_gated_load_is_a_branch_and_nothing_is_contracted():
    source = LLVMRenderer().render(_gated_kernel())
    loads = [line for line in source.splitlines() if " = load float" in line]
    assert loads and not any("select" in line for line in loads)
    assert "phi float" in source and "br i1" in source
    for flag in (" fast ", " contract ", " reassoc ", " nnan ", " ninf ", "fmuladd", "llvm.fma"):
        assert flag not in source, flag


def test_a_gated_load_reads_nothing_past_its_gate():
    x = np.array([1.0, 2.0, 3.0], np.float32)      # 3 elements, 5 workgroups: 2 gated off
    out = np.zeros(5, np.float32)
    _run(_gated_kernel(), [x, out])
    np.testing.assert_array_equal(out, [2, 5, 10, 1, 1])


def test_acc_loops_branches_division_and_barriers_run_like_the_interpreter():
    """An ACC read across loop iterations, an IF, integer division by zero and MIN / -1 (which
    must not trap), an unsigned compare, and LOCAL memory with a BARRIER over 8 threads."""
    b = KernelBuilder("mixed")
    x, out, quotient = b.param(dtypes.int8), b.param(dtypes.int32), b.param(dtypes.int8)
    divisor = b.param(dtypes.int8)
    shared = b.local(dtypes.int32, 8)
    t, g = b.special("local"), b.special("group")
    i = b.alu(Op.ADD, b.alu(Op.MUL, g, b.const(8)), t)
    a = b.load(x, i)
    acc = b.acc(b.const(0))
    with (b.loop(b.const(0), b.var("n")) as k,
          b.branch(b.alu(Op.CMPLT, b.alu(Op.MOD, k, b.const(3)), b.const(2)))):
        b.assign(acc, b.alu(Op.ADD, b.alu(Op.MUL, acc, b.const(3)), k))
    b.store(shared, t, b.alu(Op.ADD, acc, b.cast(a, dtypes.int32)))
    b.barrier()
    b.store(out, i, b.load(shared, b.alu(Op.SUB, b.const(7), t)))
    b.store(quotient, i, b.alu(Op.IDIV, a, b.load(divisor, i)))
    kernel = b.build(grid=(2, 1, 1), block=(8, 1, 1))
    x = np.array([-128, -128, -7, 100, 0, 1, 2, 3] * 2, np.int8)
    divisors = np.array([0, -1] * 8, np.int8)
    want = [x.copy(), np.zeros(16, np.int32), np.zeros(16, np.int8), divisors]
    interpreter.run(kernel, want, [6])
    got = [x.copy(), np.zeros(16, np.int32), np.zeros(16, np.int8), divisors]
    _run(kernel, got, [6])
    np.testing.assert_array_equal(got[1], want[1])
    # Even threads divide by 0 and x[1] is -128 / -1: unspecified, but they must not trap.
    defined = (np.arange(16) % 2 == 1) & (x != -128)
    np.testing.assert_array_equal(got[2][defined], want[2][defined])


def test_an_mma_node_without_a_rendering_names_the_unit_and_the_fix():
    unit = row_per_thread(1, dtypes.float32, dtypes.float32)
    with pytest.raises(CapabilityError, match=r"m1n1k1_float32_float32.*matrix_units"):
        LLVMRenderer().render(mma_kernel(unit, tiles=1))
