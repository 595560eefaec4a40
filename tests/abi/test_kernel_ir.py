"""The kernel IR: an exact JSON round trip, and a validator that names each broken rule."""
import dataclasses
import json
import math

import numpy as np
import pytest

from portkit.abi import (
    InvalidKernel,
    Kernel,
    KernelBuilder,
    Node,
    Op,
    dtypes,
    interpreter,
    validate,
)
from portkit.abi import kernel as kernel_module
from portkit.abi.kernel import scalar_words, word_value
from portkit.conformance import generate, tier3_kernels
from portkit.conformance.case import Context
from portkit.reference_backends.interpreter.capabilities import (
    capabilities as interpreter_capabilities,
)

F32, I32 = dtypes.float32, dtypes.int32
CTX = Context(interpreter_capabilities(), quick=True)


@pytest.mark.parametrize("kc", [
    tier3_kernels.fused(CTX, F32, 100), tier3_kernels.local_tree_sum(CTX, 8),
    tier3_kernels.scalar_args(CTX), tier3_kernels.word_scalar_args(CTX),
    tier3_kernels.grid_3d(CTX),
], ids=["fused", "tree-sum", "scalars", "word-scalars", "grid-3d"])
def test_json_round_trip_is_exact(kc):
    text = kc.kernel.to_json()
    assert Kernel.from_json(text) == kc.kernel
    assert json.loads(text)["abi_version"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), -0.0, 0.1, 5e-324])
def test_float_constants_survive_json_bit_for_bit(value):
    b = KernelBuilder("k")
    b.store(b.param(F32), b.const(0), b.const(value, F32))
    kernel = b.build()
    back = Kernel.from_json(kernel.to_json()).nodes[2].arg
    assert back.hex() == value.hex()


def test_nan_constant_survives_json():
    b = KernelBuilder("k")
    b.store(b.param(F32), b.const(0), b.const(float("nan"), F32))
    back = Kernel.from_json(b.build().to_json()).nodes[2].arg
    assert math.isnan(back)


def test_every_one_op_kernel_round_trips():
    for op in (Op.WHERE, Op.MULACC, Op.CMPLT):
        kernel = generate.op_kernel(op, F32, 3)
        assert Kernel.from_json(kernel.to_json()) == kernel
    cast = generate.op_kernel(Op.BITCAST, F32, 3, I32)
    assert Kernel.from_json(cast.to_json()) == cast


def _kernel(*nodes, grid=(1, 1, 1), block=(1, 1, 1)):
    return Kernel("bad", tuple(nodes), grid, block)


P = Node(Op.PARAM, F32, (), 0)
ZERO = Node(Op.CONST, I32, (), 0)


@pytest.mark.parametrize("kernel, message", [
    (_kernel(P, grid=(0, 1, 1)), "grid must be 3 positive ints"),
    (_kernel(P, Node(Op.LOAD, F32, (0, 5))), "source 5 is not an earlier node"),
    (_kernel(P, ZERO, Node(Op.ADD, F32, (0, 1))), "operand dtypes differ"),
    (_kernel(P, ZERO, Node(Op.ADD, F32, (1, 1))), "result dtype must be dtypes.int32"),
    (_kernel(P, Node(Op.CONST, dtypes.bool_, (), True), Node(Op.SQRT, dtypes.bool_, (1,))),
     "is not defined on dtypes.bool"),
    (_kernel(P, ZERO, Node(Op.LOAD, F32, (1, 1))), "first source must be a PARAM or LOCAL"),
    (_kernel(P, Node(Op.CONST, F32, (), 0.0), Node(Op.LOAD, F32, (0, 1))),
     "index must be int32"),
    (_kernel(P, ZERO, Node(Op.LOAD, I32, (0, 1))), "buffer holds dtypes.float32"),
    (_kernel(P, ZERO, Node(Op.RANGE, I32, (1, 1))), "is never closed"),
    (_kernel(P, ZERO, Node(Op.END, None, (1,))), "must close the innermost open RANGE"),
    (_kernel(P, Node(Op.CONST, I32, (), 2**31)), "is not a dtypes.int32"),
    (_kernel(Node(Op.PARAM, F32, (), 1)), "PARAM positions must be 0..n-1"),
    (_kernel(P, Node(Op.VAR, I32, (), "n"), Node(Op.VAR, I32, (), "n")), "VAR names repeat"),
    (_kernel(P, Node(Op.VAR, I32, (), "for")), "named by an identifier"),
    (_kernel(P, Node(Op.VAR, dtypes.int64, (), "n")), "must be one of"),
    (_kernel(P, Node(Op.SPECIAL, I32, (), ("thread", 0))), "with arg in"),
    (_kernel(P, Node(Op.CONST, F32, (), 1.0), Node(Op.BITCAST, dtypes.int64, (1,))),
     "sizes differ"),
    (_kernel(P, Node(Op.CONST, dtypes.bool_, (), True), Node(Op.IF, None, (1,)),
             Node(Op.BARRIER), Node(Op.ENDIF, None, (2,))), "BARRIER inside an IF"),
    (_kernel(P, ZERO, Node(Op.STORE, F32, (0, 1, 0))), "dtype must be None"),
    (_kernel(P, ZERO, Node(Op.ASSIGN, None, (1, 1))), "to an ACC"),
])
def test_validator_names_the_broken_rule(kernel, message):
    with pytest.raises(InvalidKernel, match=message.replace("(", r"\(").replace(".", r"\.")):
        validate(kernel)


def test_a_kernel_is_walked_by_the_validator_once(monkeypatch):
    # the builder validates a kernel, and the runtime again before rendering it: the second
    # is a look-up, not another pass over its nodes
    kernel = generate.op_kernel(Op.ADD, F32, 3)
    walked = []
    original = kernel_module._check_node
    monkeypatch.setattr(kernel_module, "_check_node",
                        lambda *args: walked.append(1) or original(*args))
    assert validate(kernel) is kernel and not walked
    copy = Kernel.from_json(kernel.to_json())       # equal, but not known to be valid
    validate(copy)
    assert walked
    broken = dataclasses.replace(kernel, grid=(0, 1, 1))
    with pytest.raises(InvalidKernel, match="grid must be 3 positive ints"):
        validate(broken)


def test_use_of_a_value_from_a_closed_loop_is_rejected():
    b = KernelBuilder("scope")
    out = b.param(I32)
    with b.loop(b.const(0), b.const(3)) as i:
        inner = b.alu(Op.ADD, i, b.const(1))
    b.store(out, b.const(0), inner)
    with pytest.raises(InvalidKernel, match="closed before here"):
        b.build()


def test_from_json_rejects_an_unknown_op():
    text = json.dumps({"abi_version": "0.1", "name": "k", "grid": [1, 1, 1], "block": [1, 1, 1],
                       "nodes": [{"op": "FMA", "dtype": "float32", "src": [], "arg": None}]})
    with pytest.raises(InvalidKernel, match="unknown op 'FMA'"):
        Kernel.from_json(text)


@pytest.mark.parametrize(("dtype", "value", "word"), [
    (I32, -3, -3), (dtypes.uint32, 2**32 - 1, -1), (F32, 1.0, 0x3F800000),
    (F32, -0.0, -(2**31)), (F32, math.inf, 0x7F800000), (F32, 1e39, 0x7F800000),
    (I32, 2**32 + 5, 5)])
def test_scalars_travel_as_32_bit_words(dtype, value, word):
    assert scalar_words((dtype,), (value,)) == [word]
    back = word_value(word, dtype)
    assert back.dtype == dtype.np
    with np.errstate(over="ignore"):      # 1e39 is inf in float32, as a cast gives
        assert np.array(back).tobytes() == np.array(value).astype(dtype.np).tobytes()


def test_a_float_var_reads_its_value_in_the_interpreter():
    b = KernelBuilder("scale")
    out = b.param(F32)
    b.store(out, b.const(0), b.alu(Op.MUL, b.var("lr", F32), b.const(2.0, F32)))
    buffer = np.zeros(1, np.float32)
    interpreter.run(b.build(), [buffer], scalar_words((F32,), (0.37,)))
    assert buffer[0] == np.float32(0.37) * 2
