"""Tier 2, ABI ops: every compute op on every dtype, against the spec's oracle and budget, and
every declared matrix unit's MMA (matrix_cases.py).

Each case is one kernel that applies one op to edge values (crossed when that stays small) and
random values; inputs outside spec.valid are masked out, never compared.
"""
from __future__ import annotations

import numpy as np

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.ops import BINARY, CONVERSION, DOMAIN, TERNARY, UNARY, Op
from portkit.conformance import generate, matrix_cases
from portkit.conformance.case import Case, Check, Context, KernelCase
from portkit.conformance.tier1_runtime import ESSENTIAL

TIER = 2
NAME = "ops"
# Denormal flushing, where a device declares it, applies to these result types.
FLUSHED = (dtypes.float16, dtypes.float32)


def case_id(op: Op, dtype: DType, target: DType | None = None) -> str:
    """"ops/ADD/float32", or "ops/CAST/float32->int8" for conversions."""
    return f"ops/{op.name}/{dtype_key(dtype, target)}"


def dtype_key(dtype: DType, target: DType | None = None) -> str:
    """The dtype column of a case: the operand dtype, or "source->target" for conversions."""
    return f"{dtype.name}->{target.name}" if target else dtype.name


def make(ctx: Context, op: Op, dtype: DType, target: DType | None = None) -> KernelCase:
    """The kernel case of one op on one dtype: inputs, kernel and the oracle's answer."""
    rng = ctx.rng(case_id(op, dtype, target))
    inputs, labels = generate.op_inputs(op, dtype, rng, 48 if ctx.quick else 2000, target)
    n = len(inputs[0])
    kernel = generate.op_kernel(op, dtype, n, target)
    out_dtype = kernel.params[-1].dtype
    flush = ctx.capabilities.denormals == "flush" and (
        out_dtype in FLUSHED or dtype in FLUSHED)
    expected, mask = generate.expected(op, inputs, target, flush)
    check = Check(output=len(inputs), kind="op", expected=expected, count=n, op=op.name,
                  dtype=out_dtype.name, mask=mask, operands=tuple(range(len(inputs))),
                  labels=labels)
    return KernelCase(kernel, inputs + [np.zeros_like(expected[0])], [check])


def _quick_conversions(op: Op) -> list[tuple[DType, DType]]:
    # Every source and every target at least once, and every source to bool/int32/float32.
    pairs = generate.conversion_pairs(op)
    if op is Op.BITCAST:
        chosen = []
        for source in dtypes.ALL:
            same = [t for s, t in pairs if s == source]
            chosen.append((source, same[(same.index(source) + 1) % len(same)]))
        return chosen
    common = (dtypes.bool_, dtypes.int32, dtypes.float32)
    chosen = [(s, t) for s, t in pairs if t in common]
    chosen += [(dtypes.ALL[(i + 1) % len(dtypes.ALL)], t) for i, t in enumerate(dtypes.ALL)]
    return sorted(set(chosen), key=pairs.index)


def cases(ctx: Context) -> list[Case]:
    """One case per op and dtype (per source and target dtype for CAST and BITCAST)."""
    found = []
    for op in UNARY + BINARY + TERNARY:
        for dtype in DOMAIN[op]:
            found.append(Case(case_id(op, dtype), TIER, op.name, dtype.name, ESSENTIAL,
                              make=lambda op=op, dtype=dtype: make(ctx, op, dtype)))
    for op in CONVERSION:
        pairs = _quick_conversions(op) if ctx.quick else generate.conversion_pairs(op)
        for source, target in pairs:
            found.append(Case(case_id(op, source, target), TIER, op.name,
                              dtype_key(source, target), ESSENTIAL,
                              make=lambda op=op, s=source, t=target: make(ctx, op, s, t)))
    return found + matrix_cases.cases(ctx)
