"""The ABI's operations: 25 compute ops and 15 structural nodes. This list is frozen per ABI_VERSION.

Compute ops take and give values; structural nodes give a kernel its shape (arguments, thread
indices, memory, loops, branches). The semantics of every compute op per dtype is in spec.py.
"""
from __future__ import annotations

from enum import Enum

from portkit.abi import dtypes
from portkit.abi.dtypes import DType


class Op(Enum):
    """Every node of an ABI kernel has one of these ops. The value is its name in JSON."""

    # unary
    NEG = "NEG"
    RECIP = "RECIP"
    SQRT = "SQRT"
    EXP2 = "EXP2"
    LOG2 = "LOG2"
    SIN = "SIN"
    TRUNC = "TRUNC"
    # binary
    ADD = "ADD"
    SUB = "SUB"
    MUL = "MUL"
    FDIV = "FDIV"
    IDIV = "IDIV"
    MOD = "MOD"
    MAX = "MAX"
    CMPLT = "CMPLT"
    CMPNE = "CMPNE"
    AND = "AND"
    OR = "OR"
    XOR = "XOR"
    SHL = "SHL"
    SHR = "SHR"
    # ternary
    WHERE = "WHERE"
    MULACC = "MULACC"
    # type conversion (the node's dtype is the target)
    CAST = "CAST"
    BITCAST = "BITCAST"
    # structural
    PARAM = "PARAM"      # buffer argument; arg = its position, dtype = its element type
    VAR = "VAR"          # scalar argument (int32, uint32, float32); arg = its name; after buffers
    CONST = "CONST"      # arg = the value
    SPECIAL = "SPECIAL"  # arg = ("group" | "local", axis 0..2): workgroup id or thread id in it
    RANGE = "RANGE"      # src = (start, end): loop over [start, end); its value is the counter
    END = "END"          # src = (range,): closes the loop
    IF = "IF"            # src = (cond,): runs the nodes up to its ENDIF when cond is true
    ENDIF = "ENDIF"      # src = (if,)
    LOAD = "LOAD"        # src = (buffer, index[, gate]): buffer[index], or 0 when gate is false
    STORE = "STORE"      # src = (buffer, index, value[, gate]): no value
    LOCAL = "LOCAL"      # workgroup memory; arg = number of elements, dtype = element type
    ACC = "ACC"          # src = (init,): a mutable register; reading it gives its current value
    ASSIGN = "ASSIGN"    # src = (acc, value): sets the register
    BARRIER = "BARRIER"  # all threads of a workgroup wait here; orders LOCAL memory
    # Optional: only on a device that declares the unit (Capabilities.matrix_units).
    MMA = "MMA"          # src = (A fragment, B fragment, C ACCs), arg = a MatrixUnit: the
    #                      unit's threads multiply their tiles together; C's ACCs become C + A·B


UNARY = (Op.NEG, Op.RECIP, Op.SQRT, Op.EXP2, Op.LOG2, Op.SIN, Op.TRUNC)
BINARY = (Op.ADD, Op.SUB, Op.MUL, Op.FDIV, Op.IDIV, Op.MOD, Op.MAX, Op.CMPLT, Op.CMPNE,
          Op.AND, Op.OR, Op.XOR, Op.SHL, Op.SHR)
TERNARY = (Op.WHERE, Op.MULACC)
CONVERSION = (Op.CAST, Op.BITCAST)
COMPUTE = UNARY + BINARY + TERNARY + CONVERSION
STRUCTURAL = (Op.PARAM, Op.VAR, Op.CONST, Op.SPECIAL, Op.RANGE, Op.END, Op.IF, Op.ENDIF,
              Op.LOAD, Op.STORE, Op.LOCAL, Op.ACC, Op.ASSIGN, Op.BARRIER, Op.MMA)
COMPARISON = (Op.CMPLT, Op.CMPNE)

# The compute ops a backend may leave out: codegen rewrites them into the others
# (portkit/codegen/decompose.py). Every other compute op is required of every backend.
OPTIONAL = frozenset({Op.NEG, Op.SUB, Op.MAX, Op.MULACC, Op.RECIP, Op.TRUNC,
                      Op.EXP2, Op.LOG2, Op.SIN})
REQUIRED = frozenset(COMPUTE) - OPTIONAL

_FLOATS, _INTS, _NUMERIC, _ALL = dtypes.FLOATS, dtypes.INTS, dtypes.NUMERIC, dtypes.ALL
_LOGIC = (dtypes.bool_,) + _INTS

# The dtypes each compute op is defined on (for its operands; comparisons give bool, WHERE's
# first operand is bool). An op outside its domain is an invalid kernel.
DOMAIN: dict[Op, tuple[DType, ...]] = {
    Op.NEG: _NUMERIC, Op.RECIP: _FLOATS, Op.SQRT: _FLOATS, Op.EXP2: _FLOATS, Op.LOG2: _FLOATS,
    Op.SIN: _FLOATS, Op.TRUNC: _FLOATS,
    Op.ADD: _NUMERIC, Op.SUB: _NUMERIC, Op.MUL: _NUMERIC, Op.FDIV: _FLOATS, Op.IDIV: _INTS,
    Op.MOD: _INTS, Op.MAX: _NUMERIC, Op.CMPLT: _ALL, Op.CMPNE: _ALL,
    Op.AND: _LOGIC, Op.OR: _LOGIC, Op.XOR: _LOGIC, Op.SHL: _INTS, Op.SHR: _INTS,
    Op.WHERE: _ALL, Op.MULACC: _NUMERIC, Op.CAST: _ALL, Op.BITCAST: _ALL,
}
