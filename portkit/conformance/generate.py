"""Case generation shared by `portkit conform` and pytest: edge values, random values, op kernels.

Edge values come in named classes (zero, inf, nan, denormal, ...) so that a failure can say which
kind of input broke, and so that a quick run can promise every class at least once.
"""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from portkit.abi import dtypes, spec
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, KernelBuilder
from portkit.abi.ops import COMPUTE, TERNARY, UNARY, Op

# Operand count of each compute op (CAST and BITCAST take one).
ARITY = {op: 1 if op in UNARY or op in (Op.CAST, Op.BITCAST) else 3 if op in TERNARY else 2
         for op in COMPUTE}


def edge_values(dtype: DType) -> dict[str, np.ndarray]:
    """The edge inputs of `dtype`, by class: what a careless backend gets wrong first."""
    if dtype == dtypes.bool_:
        return {"false": np.array([False]), "true": np.array([True])}
    if dtype.is_int:
        lo, hi = int(dtype.min), int(dtype.max)
        classes = {"zero": [0], "one": [1, -1] if lo < 0 else [1, 2],
                   "min": [lo, lo + 1], "max": [hi, hi - 1]}
        return {k: np.array(v).astype(dtype.np) for k, v in classes.items()}
    info = ml_dtypes.finfo(dtype.np)
    sub, normal, big = float(info.smallest_subnormal), float(info.smallest_normal), float(info.max)
    classes = {
        "zero": [0.0, -0.0], "inf": [np.inf, -np.inf], "nan": [np.nan],
        "denormal": [sub, -sub, normal - sub, -(normal - sub)],
        "min_normal": [normal, -normal],
        "near_overflow": [big, -big, big / 2],
        "one": [1.0, -1.0, 0.5, 3.0],
    }
    return {k: np.array(v, np.float64).astype(dtype.np) for k, v in classes.items()}


def random_values(dtype: DType, n: int, rng: np.random.Generator, op: Op | None = None,
                  operand: int = 0) -> np.ndarray:
    """`n` random values of `dtype`, spread where `op` (as its `operand`-th input) is defined."""
    if dtype == dtypes.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dtype.is_int:
        if op in (Op.SHL, Op.SHR) and operand == 1:
            return rng.integers(0, dtype.bits, n).astype(dtype.np)
        wide = rng.integers(int(dtype.min), int(dtype.max), n, dtype=dtype.np, endpoint=True)
        small = rng.integers(0 if dtype.kind == "uint" else -100, 100, n).astype(dtype.np)
        return np.where(rng.random(n) < 0.5, wide, small)
    info = ml_dtypes.finfo(dtype.np)
    # Half the values in a small range, half log-uniform over the dtype's whole exponent range.
    small = rng.uniform(-8, 8, n)
    spread = np.exp2(rng.uniform(info.minexp, info.maxexp, n)) * rng.choice([-1.0, 1.0], n)
    values = np.where(rng.random(n) < 0.5, small, spread)
    if op is Op.EXP2:
        values = rng.uniform(-info.maxexp - 30, info.maxexp + 2, n)
    elif op is Op.SIN:
        values = np.where(rng.random(n) < 0.8, rng.uniform(-10, 10, n), values)
    elif op in (Op.SQRT, Op.LOG2):
        values = np.abs(values)
    with np.errstate(over="ignore"):     # the top of the range may round to inf: fine
        return values.astype(dtype.np)


def op_inputs(op: Op, dtype: DType, rng: np.random.Generator, n_random: int,
              target: DType | None = None) -> tuple[list[np.ndarray], list[str]]:
    """Operands for one op on `dtype` (source dtype for CAST/BITCAST, `target` its result).

    Every edge value appears in every operand position at least once, edge pairs are crossed
    when that stays small, and `n_random` random tuples follow. Also gives each element's
    edge classes, e.g. "nan,one", for failure messages.
    """
    arity = ARITY[op]
    operand_dtypes = [dtypes.bool_, dtype, dtype] if op is Op.WHERE else [dtype] * arity
    edges = [_flat_edges(d) for d in operand_dtypes]
    combos: list[tuple[int, ...]] = []
    if np.prod([len(e[0]) for e in edges]) <= 1024:
        combos = list(itertools.product(*(range(len(e[0])) for e in edges)))
    else:
        longest = max(len(e[0]) for e in edges)
        combos = [tuple(i % len(e[0]) for e in edges) for i in range(longest)]
        combos += [tuple(int(rng.integers(len(e[0]))) for e in edges) for _ in range(512)]
    columns = []
    for position, (values, _) in enumerate(edges):
        picked = values[[c[position] for c in combos]]
        extra = random_values(operand_dtypes[position], n_random, rng, op, position)
        columns.append(np.concatenate([picked, extra]).astype(operand_dtypes[position].np))
    if op is Op.CAST and dtype.is_float and target is not None and target.is_int:
        # Most random floats are out of the target's range (undefined); add some that fit.
        limit = float(ml_dtypes.finfo(dtype.np).max)
        low, high = max(float(target.min), -limit), min(float(target.max), limit)
        fits = rng.uniform(low, high, n_random).astype(dtype.np)
        # Rounding to a narrow float can land on the range's end (2^64 for uint64): drop those.
        wide = fits.astype(np.float64)
        fits = fits[(wide > low) & (wide < high)]
        columns[0] = np.concatenate([columns[0], fits])
    labels = [",".join(edges[p][1][c[p]] for p in range(arity)) for c in combos]
    labels += ["random"] * (len(columns[0]) - len(labels))
    return columns, labels


def _flat_edges(dtype: DType) -> tuple[np.ndarray, list[str]]:
    classes = edge_values(dtype)
    values = np.concatenate(list(classes.values())).astype(dtype.np)
    names = [name for name, v in classes.items() for _ in v]
    return values, names


def conversion_pairs(op: Op) -> list[tuple[DType, DType]]:
    """(source, target) pairs of CAST (all) or BITCAST (equal sizes)."""
    return [(s, t) for s in dtypes.ALL for t in dtypes.ALL
            if op is Op.CAST or s.itemsize == t.itemsize]


def op_kernel(op: Op, dtype: DType, n: int, target: DType | None = None) -> Kernel:
    """One op over `n` elements: out[i] = op(in0[i], ...), one workgroup of one thread per i.

    Uses no index arithmetic, so a failure here is the op's own and not the indexing's.
    """
    suffix = f"_{target.name}" if target else ""
    b = KernelBuilder(f"conform_{op.name.lower()}_{dtype.name}{suffix}")
    operand_dtypes = [dtypes.bool_, dtype, dtype] if op is Op.WHERE else [dtype] * ARITY[op]
    params = [b.param(d) for d in operand_dtypes]
    if op in (Op.CAST, Op.BITCAST):
        out_dtype = target
    else:
        out_dtype = dtypes.bool_ if op in (Op.CMPLT, Op.CMPNE) else dtype
    out = b.param(out_dtype)
    i = b.special("group", 0)
    loaded = [b.load(p, i) for p in params]
    if op in (Op.CAST, Op.BITCAST):
        value = b.cast(loaded[0], target, bitcast=op is Op.BITCAST)
    else:
        value = b.alu(op, *loaded)
    b.store(out, i, value)
    return b.build(grid=(n, 1, 1))


def expected(op: Op, inputs: list[np.ndarray], target: DType | None,
             flush: bool) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The acceptable results of `op` on `inputs` and the mask of defined elements.

    With `flush` (a device that declares denormals flushed), results computed from flushed
    inputs and flushed afterwards are accepted too, so the allowance is explicit.
    """
    results = spec.evaluate(op, *inputs, dtype=target)
    mask = spec.valid(op, *inputs, dtype=target)
    if flush:
        flushed = spec.evaluate(op, *(spec.flush_denormals(a) for a in inputs), dtype=target)
        results = results + tuple(spec.flush_denormals(r) for r in flushed + results)
    return results, np.asarray(mask)
