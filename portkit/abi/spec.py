"""What every compute op means, for every dtype: executable numpy code, a sentence, a budget.

This module is the oracle of conformance. Rules shared by all ops:
- Integers are two's complement and wrap on overflow; bool is 0 or 1.
- Float results are the exact result rounded to nearest-even in the dtype, within the op's ULP
  budget (0 = correctly rounded). The oracle computes float16/bfloat16/float32 in float64 and
  rounds once. The sign of a zero result is not checked. A NaN result may have any payload.
- Inputs outside an op's `valid` domain give an unspecified result and are never tested.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.ops import COMPARISON, DOMAIN, Op

Array = np.ndarray


@dataclass(frozen=True)
class OpSpec:
    """One op: what it computes, when the result is defined, and how exact it must be."""

    text: str
    fn: Callable[..., Array]                  # numpy, on float64 (for floats) or the dtype
    valid: Callable[..., Array] | None = None  # inputs -> bool mask of defined inputs
    ulp: dict[str, float] | None = None        # float dtype name -> budget; None: exact
    atol_near_zero: bool = False               # also pass |error| <= ulp * eps (results near 0)


def _shift_valid(a: Array, b: Array) -> Array:
    bits = a.dtype.itemsize * 8
    return (b >= 0) & (b < bits)


def _div_valid(a: Array, b: Array) -> Array:
    ok = b != 0
    if np.issubdtype(a.dtype, np.signedinteger):
        ok &= ~((a == np.iinfo(a.dtype).min) & (b == -1))
    return ok


def _idiv(a: Array, b: Array) -> Array:
    b = np.where(b == 0, 1, b).astype(a.dtype)
    q = a // b
    return np.where((q < 0) & (q * b != a), q + 1, q).astype(a.dtype)


def _mod(a: Array, b: Array) -> Array:
    b = np.where(b == 0, 1, b).astype(a.dtype)
    return (a - _idiv(a, b) * b).astype(a.dtype)


# Like most GPU sines, the ABI's SIN promises its budget on a bounded range, which every
# target's sine (and the polynomial in codegen/decompose.py) meets.
SIN_RANGE = 65536.0


def _sin_valid(a: Array) -> Array:
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(a) | (np.abs(a.astype(np.float64)) <= SIN_RANGE)


_SHIFT_TEXT = "the shift amount b must be in [0, bits); "

SPECS: dict[Op, OpSpec] = {
    Op.NEG: OpSpec("-a. Integers wrap (NEG of the minimum is the minimum; unsigned: 2^n - a).",
                   np.negative),
    Op.RECIP: OpSpec("1 / a. RECIP(±0) = ±inf.", lambda a: 1.0 / a,
                     ulp={"float16": 1, "bfloat16": 1, "float32": 2.5, "float64": 0}),
    Op.SQRT: OpSpec("Square root. SQRT(-0) = -0; negative a gives NaN.", np.sqrt,
                    ulp={"float16": 1.5, "bfloat16": 1, "float32": 3, "float64": 0}),
    Op.EXP2: OpSpec("2^a. EXP2(-inf) = 0, EXP2(inf) = inf.", np.exp2,
                    ulp={"float16": 2, "bfloat16": 1, "float32": 3, "float64": 3}),
    Op.LOG2: OpSpec("Base-2 logarithm. LOG2(±0) = -inf; negative a gives NaN.", np.log2,
                    ulp={"float16": 2, "bfloat16": 1, "float32": 3, "float64": 3},
                    atol_near_zero=True),
    Op.SIN: OpSpec("Sine of a in radians, for -65536 <= a <= 65536 (2^16); beyond that "
                   "undefined. SIN(±inf) = NaN.", np.sin, _sin_valid,
                   ulp={"float16": 2, "bfloat16": 1, "float32": 4, "float64": 4},
                   atol_near_zero=True),
    Op.TRUNC: OpSpec("Rounds toward zero to an integral value; keeps ±0, ±inf, NaN.", np.trunc),
    Op.ADD: OpSpec("a + b. Floats correctly rounded; integers wrap.", np.add),
    Op.SUB: OpSpec("a - b. Floats correctly rounded; integers wrap.", np.subtract),
    Op.MUL: OpSpec("a * b. Floats correctly rounded; integers wrap.", np.multiply),
    Op.FDIV: OpSpec("a / b on floats. x/±0 = ±inf for x != 0; 0/0 = NaN.", np.divide,
                    ulp={"float16": 1, "bfloat16": 1, "float32": 2.5, "float64": 0}),
    Op.IDIV: OpSpec("a / b on integers, rounded toward zero (as in C). b = 0, and MIN / -1 for "
                    "signed types, must not trap; their result is unspecified.", _idiv,
                    _div_valid),
    Op.MOD: OpSpec("a - IDIV(a, b) * b: the remainder takes the sign of a (as C's %). Defined "
                   "where IDIV is.", _mod, _div_valid),
    Op.MAX: OpSpec("The larger of a and b; NaN if either is NaN. MAX(-0, +0) may be either.",
                   np.maximum),
    Op.CMPLT: OpSpec("a < b, as bool. False when either is NaN; for bool, false < true.",
                     np.less),
    Op.CMPNE: OpSpec("a != b, as bool. True when either is NaN.", np.not_equal),
    Op.AND: OpSpec("Bitwise and (logical on bool).", np.bitwise_and),
    Op.OR: OpSpec("Bitwise or (logical on bool).", np.bitwise_or),
    Op.XOR: OpSpec("Bitwise exclusive or (logical on bool).", np.bitwise_xor),
    Op.SHL: OpSpec("a << b, bits shifted out are lost (signed a too: two's complement); "
                   + _SHIFT_TEXT + "otherwise undefined.",
                   lambda a, b: np.left_shift(a, b.astype(a.dtype)), _shift_valid),
    Op.SHR: OpSpec("a >> b: arithmetic (sign-filling) for signed, logical for unsigned; "
                   + _SHIFT_TEXT + "otherwise undefined.",
                   lambda a, b: np.right_shift(a, b.astype(a.dtype)), _shift_valid),
    Op.WHERE: OpSpec("c ? a : b, elementwise; c is bool.", np.where),
    Op.MULACC: OpSpec("a * b + c. Floats: rounded once (fused) or twice (a*b, then + c); "
                      "either passes. Integers wrap.", lambda a, b, c: a * b + c),
    # CAST and BITCAST take the node's dtype as a second argument.
    Op.CAST: OpSpec("Converts to the node's dtype. To bool: a != 0 (NaN is true). Float to int: "
                    "toward zero, undefined if out of range or NaN. Int to int: wraps. To a "
                    "float: the exact value rounded once to nearest-even; overflow gives ±inf.",
                    lambda a, to: _cast(a, to), lambda a, to: _cast_valid(a, to)),
    Op.BITCAST: OpSpec("Reinterprets the bits as the node's dtype (same size).",
                       lambda a, to: np.ascontiguousarray(a).view(to.np)),
}


def _fraction_fma(a: Array, b: Array, c: Array) -> Array:
    # float64 has no wider type in numpy: compute a*b+c exactly with rationals, round once.
    def one(x: float, y: float, z: float) -> float:
        if not np.isfinite([x, y, z]).all():
            return x * y + z
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        try:
            return float(exact)
        except OverflowError:
            return float(np.copysign(np.inf, float(exact > 0) - 0.5))
    out = [one(x, y, z) for x, y, z in zip(a.ravel(), b.ravel(), c.ravel())]
    return np.array(out, np.float64).reshape(a.shape)


def valid(op: Op, *args: Array, dtype: DType | None = None) -> Array:
    """A bool mask: True where the inputs have a defined result (see each op's text)."""
    spec = SPECS[op]
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    if spec.valid is None:
        return np.ones(shape, bool)
    return np.array(np.broadcast_to(spec.valid(*args, *_target(op, dtype)), shape))


def _target(op: Op, dtype: DType | None) -> tuple[DType, ...]:
    """The extra argument of CAST and BITCAST (the node's dtype); none for the other ops."""
    if op not in (Op.CAST, Op.BITCAST):
        return ()
    if dtype is None:
        raise ValueError(f"{op.name} converts to the node's dtype: pass dtype=")
    return (dtype,)


def _cast_valid(a: Array, to: DType) -> Array:
    src = dtypes.from_numpy(a.dtype)
    if src.is_float and to.is_int:
        t = np.trunc(a.astype(np.float64))
        low, high = float(to.min), 2.0 ** (to.bits - (to.kind == "int"))   # exact powers of 2
        with np.errstate(invalid="ignore"):
            return np.isfinite(t) & (t >= low) & (t < high)
    return np.ones(a.shape, bool)


def evaluate(op: Op, *args: Array, dtype: DType | None = None) -> tuple[Array, ...]:
    """The acceptable results of `op` (the node's `dtype` for CAST/BITCAST), in that dtype.

    Usually one array; MULACC on floats gives two (fused and unfused). Elements outside
    `valid` hold arbitrary values.
    """
    src = dtypes.from_numpy(args[-1].dtype)
    if op in (Op.CAST, Op.BITCAST):
        return (SPECS[op].fn(args[0], *_target(op, dtype)),)
    out = dtypes.bool_ if op in COMPARISON else src
    if src not in DOMAIN[op]:
        raise ValueError(f"{op.name} is not defined on {src}")
    with np.errstate(all="ignore"):
        if not src.is_float:
            return (np.asarray(SPECS[op].fn(*args)).astype(out.np),)
        wide = [a if a.dtype == bool else a.astype(np.float64) for a in args]
        if op is Op.MULACC:
            if src == dtypes.float64:
                fused = _fraction_fma(*wide)
            else:
                fused = wide[0] * wide[1] + wide[2]      # exact product, one rounding
            product = _round(wide[0] * wide[1], src).astype(np.float64)
            return (_round(fused, src), _round(product + wide[2], src))
        result = np.asarray(SPECS[op].fn(*wide))
        return (result.astype(out.np) if out == dtypes.bool_ else _round(result, out),)


def _cast(a: Array, to: DType) -> Array:
    src = dtypes.from_numpy(a.dtype)
    with np.errstate(all="ignore"):
        if to == dtypes.bool_:
            return a != 0
        if src.is_float and to.is_int:
            t = np.trunc(a.astype(np.float64))
            return np.where(_cast_valid(a, to), t, 0).astype(to.np)
        if src.is_int and to.is_float:
            return _round(_int_to_float64(a, odd=to != dtypes.float64), to)
        if src.is_float and to.is_float:
            return _round(a.astype(np.float64), to)
        return a.astype(to.np)


def _int_to_float64(a: Array, odd: bool) -> Array:
    """Integers to float64: exact up to 2^53; above, nearest-even, or with `odd`, rounded to odd
    (truncated, lowest bit set if inexact) so that a second rounding to a narrower float is
    the same as one rounding from the exact integer."""
    out = a.astype(np.float64)
    if odd:
        for i in np.flatnonzero(np.abs(out) > 2.0 ** 53):
            n = int(a.flat[i])
            shift = abs(n).bit_length() - 53
            kept = abs(n) >> shift
            kept |= int(kept << shift != abs(n))
            out.flat[i] = float(kept << shift) * (1 if n > 0 else -1)
    return out


def _round(x: Array, to: DType) -> Array:
    """float64 values rounded once, to nearest-even, to the float dtype `to`.

    numpy rounds float64 to float32 and float16 directly; ml_dtypes goes through float32 for
    bfloat16, so round to odd on the way: float32 keeps 16 more bits than bfloat16, which makes
    the second rounding exact."""
    if to != dtypes.bfloat16:
        return x.astype(to.np)
    with np.errstate(all="ignore"):
        single = x.astype(np.float32)
        wide = single.astype(np.float64)
        inexact = np.isfinite(x) & (wide != x)
        single = np.where(inexact & (np.abs(wide) > np.abs(x)),
                          np.nextafter(single, np.float32(0)), single)
        bits = single.view(np.uint32) | inexact.astype(np.uint32)
        return bits.view(np.float32).astype(to.np)


def budget(op: Op, dtype: DType) -> float:
    """The allowed error of `op` on `dtype`, in ULPs of the result (0: exact)."""
    ulp = SPECS[op].ulp
    return float(ulp[dtype.name]) if ulp and dtype.is_float else 0.0


def budget_table() -> dict[str, dict[str, float]]:
    """Every non-exact budget, {op: {dtype: ulps}}: part of the ABI's manifest."""
    return {op.name: dict(spec.ulp) for op, spec in SPECS.items() if spec.ulp}


def _ordered(x: Array) -> Array:
    """Maps floats to integers in the same order, one step per representable value."""
    bits = np.ascontiguousarray(x).view(f"i{x.dtype.itemsize}").astype(np.int64)
    return np.where(bits < 0, np.int64(np.iinfo(f"i{x.dtype.itemsize}").min) - bits, bits)


def ulp_distance(actual: Array, expected: Array) -> Array:
    """How many representable values lie between actual and expected (same float dtype).

    0 where both are NaN or both are zeros of any sign; inf where only one is NaN.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    distance = np.abs(_ordered(a) - _ordered(e)).astype(np.float64)
    with np.errstate(all="ignore"):
        a_nan, e_nan = np.isnan(a.astype(np.float32)), np.isnan(e.astype(np.float32))
    return np.where(a_nan | e_nan, np.where(a_nan & e_nan, 0.0, np.inf), distance)


def within_budget(op: Op, dtype: DType, actual: Array, expected: tuple[Array, ...],
                  mask: Array | None = None) -> tuple[Array, Array]:
    """Per element: (passes, error in ULPs, or exact-mismatch count for non-floats)."""
    if not dtype.is_float:
        ok = np.zeros(np.shape(actual), bool)
        for e in expected:
            ok |= np.asarray(actual) == e
        err = (~ok).astype(np.float64)
    else:
        err = np.min([ulp_distance(actual, e) for e in expected], axis=0)
        limit = budget(op, dtype)
        ok = err <= limit
        if SPECS[op].atol_near_zero:
            eps = _eps(dtype)
            with np.errstate(all="ignore"):
                diff = np.min([np.abs(np.asarray(actual, np.float64) - np.asarray(e, np.float64))
                               for e in expected], axis=0)
                ok |= diff <= max(limit, 1.0) * eps
    if mask is not None:
        ok = ok | ~mask
        err = np.where(mask, err, 0.0)
    return ok, err


def _eps(dtype: DType) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype.np).eps)


def flush_denormals(x: Array) -> Array:
    """x with subnormal floats replaced by zero of the same sign (for 'flush' devices)."""
    if not np.issubdtype(x.dtype, np.floating) and x.dtype.name != "bfloat16":
        return x
    tiny = _tiny(x.dtype)
    wide = x.astype(np.float64)
    return np.where((wide != 0) & (np.abs(wide) < tiny), np.copysign(0.0, wide), wide
                    ).astype(x.dtype)


def _tiny(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).smallest_normal)


# The MMA node (a matrix unit's tile multiply-accumulate, portkit/abi/matrix.py).
MMA_TEXT = ("D = C + A·B on one tile. Each product a·b is exact or rounded once to the "
            "accumulator dtype; the K products and C are summed in the accumulator dtype in any "
            "order and grouping, each addition rounded to nearest or toward zero. So each "
            "element of D is within γ(K+1)·(|c| + Σ|a·b|) of the exact value, γ(n) = n·ε/(1 - "
            "n·ε) with ε the accumulator's machine epsilon. Integer units are exact (wrapping). "
            "A NaN input gives NaN in the elements it reaches. A unit declared with "
            "denormals='flush' reads denormal inputs as zeros of their sign (the oracle flushes "
            "A, B and C first) and may write a denormal result as zero.")


def mma(a: Array, b: Array, c: Array, acc: DType, flush: bool = False) -> Array:
    """The oracle of MMA: C + A·B on stacked tiles (…×M×K, …×K×N, …×M×N), summed in float64
    and rounded once to `acc` (integers: exact, wrapped to `acc`); with `flush` (a unit that
    flushes denormals), of A, B and C with their denormals flushed to zero."""
    if flush:
        a, b, c = flush_denormals(a), flush_denormals(b), flush_denormals(c)
    if not acc.is_float:
        wide = a.astype(np.int64) @ b.astype(np.int64) + c.astype(np.int64)
        return wide.astype(acc.np)
    with np.errstate(all="ignore"):
        exact = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    return _round(exact, acc)


def mma_bound(a: Array, b: Array, c: Array, acc: DType, flush: bool = False) -> Array:
    """Per element of D, the largest |actual - exact| MMA allows (see MMA_TEXT); 0 for
    integer units. `flush`: as for `mma`."""
    if flush:
        a, b, c = flush_denormals(a), flush_denormals(b), flush_denormals(c)
    if not acc.is_float:
        return np.zeros(np.broadcast_shapes(c.shape, a.shape[:-1] + b.shape[-1:]))
    n = a.shape[-1] + 1
    eps = _eps(acc)
    gamma = n * eps / (1 - n * eps)
    with np.errstate(all="ignore"):
        magnitude = (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
                     + np.abs(c.astype(np.float64)))
    # The oracle's own rounding to `acc` adds half an ULP; a device that flushes denormal
    # partial sums loses less than the smallest normal number at each of n steps.
    return (gamma * magnitude + eps * np.abs(mma(a, b, c, acc).astype(np.float64))
            + n * _tiny(acc.np))
