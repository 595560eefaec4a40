"""Rewrites the optional ops a device lacks into ops it has: one rule per op, in DECOMPOSITIONS.

A backend lists the compute ops it runs natively (Capabilities.ops); every op in
portkit.abi.ops.REQUIRED is always among them. `decompose` replaces each other op by a small
expression in native ops, and rewrites what that expression uses in turn, so SUB becomes
ADD(a, NEG(b)) and then, on a device without NEG either, ADD(a, MUL(b, -1)).

Accuracy of the rewrites (checked by tests/codegen/test_decompose.py against portkit.abi.spec):
- NEG, SUB, MAX, MULACC, RECIP and TRUNC give exactly what the spec allows (RECIP within FDIV's
  budget, which equals RECIP's). TRUNC keeps ±0, ±inf and NaN.
- EXP2 and LOG2 are polynomials after range reduction, within their ULP budgets on every input.
- SIN reduces its argument by Cody-Waite (pi/2 split into parts whose products with the quadrant
  number are exact) below 2^20 for float32, and by Payne-Hanek (a * 2/pi mod 4 from the bits of
  2/pi the exponent of a selects, in 32-bit integer ops only, since WGSL has no 64-bit types)
  above: float32, and float16 and bfloat16 through it, meet the budget on every finite value
  (2 ulp at most in tests). float64 reduces by Cody-Waite only and meets its budget to 1e9; where
  |a| * 2/pi reaches 2^30, past which the reduced argument would leave [-pi/4, pi/4], no
  reduction is tried: a finite a gives 0. ±inf and NaN give NaN. No reference backend lacks a
  float64 SIN (WebGPU, which decomposes SIN, has no float64).
- float16 and bfloat16 compute TRUNC, EXP2, LOG2 and SIN in float32 and round the result once.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel, KernelBuilder, validate
from portkit.abi.ops import OPTIONAL, REQUIRED, Op

# |a| up to which the SIN rewrite meets its budget: every finite value but float64's
SIN_ACCURATE_TO = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
                   "float32": 3.4028234663852886e38, "float64": 1e9}


def decompose(kernel: Kernel, native: frozenset[Op]) -> Kernel:
    """`kernel` with every optional op outside `native` rewritten into native ops."""
    emitter = _Emitter(frozenset(native) | REQUIRED)
    if not any(node.op in emitter.rewrite for node in kernel.nodes):
        return kernel
    new_position: list[int] = []
    for node in kernel.nodes:
        src = tuple(new_position[s] for s in node.src)
        new_position.append(emitter.add(node.op, node.dtype, src, node.arg))
    return validate(replace(kernel, nodes=tuple(emitter.nodes)))


class _Emitter(KernelBuilder):
    """A KernelBuilder that rewrites each non-native op as it is added, by DECOMPOSITIONS."""

    def __init__(self, native: frozenset[Op]):
        super().__init__("decompose")
        self.rewrite = OPTIONAL - native

    def add(self, op: Op, dtype: DType | None = None, src: tuple[int, ...] = (),
            arg: Any = None) -> int:
        """Appends a node, or the native expression of an op the device lacks."""
        if op in self.rewrite:
            return DECOMPOSITIONS[op](self, dtype, *src)
        return super().add(op, dtype, src, arg)

    def const(self, value: Any, dtype: DType = dtypes.int32) -> int:
        # Round float constants to the dtype here, so the kernel's JSON holds the exact value.
        return super().const(float(dtype.np.type(value)) if dtype.is_float else value, dtype)

    # Shorthands that keep the rules below readable as formulas.
    def plus(self, a: int, b: int) -> int:
        return self.alu(Op.ADD, a, b)

    def sub(self, a: int, b: int) -> int:
        return self.alu(Op.SUB, a, b)

    def mul(self, a: int, b: int) -> int:
        return self.alu(Op.MUL, a, b)

    def lt(self, a: int, b: int) -> int:
        return self.alu(Op.CMPLT, a, b)

    def where(self, cond: int, a: int, b: int) -> int:
        return self.alu(Op.WHERE, cond, a, b)

    def offset(self, a: int, value: float) -> int:
        return self.plus(a, self.const(value, self.dtype(a)))

    def scale(self, a: int, value: float) -> int:
        return self.mul(a, self.const(value, self.dtype(a)))

    def is_nan(self, a: int) -> int:
        return self.alu(Op.CMPNE, a, a)

    def inside(self, a: int, limit: float) -> int:
        """-limit < a < limit; false for NaN."""
        return self.alu(Op.AND, self.lt(a, self.const(limit, self.dtype(a))),
                        self.lt(self.const(-limit, self.dtype(a)), a))

    def poly(self, x: int, coefficients: Sequence[float]) -> int:
        """c0 + c1*x + c2*x^2 + ..., by Horner's rule."""
        acc = self.const(coefficients[-1], self.dtype(x))
        for c in reversed(coefficients[:-1]):
            acc = self.offset(self.mul(acc, x), c)
        return acc


Rule = Callable[..., int]   # (emitter, node dtype, *sources) -> position of the result


def _neg(e: _Emitter, dtype: DType, a: int) -> int:
    # Multiplying by -1 wraps like NEG on signed ints; 2^n - 1 is -1 for unsigned ones.
    return e.scale(a, dtype.max if dtype.kind == "uint" else -1)


def _sub(e: _Emitter, dtype: DType, a: int, b: int) -> int:
    return e.plus(a, e.alu(Op.NEG, b))


def _max(e: _Emitter, dtype: DType, a: int, b: int) -> int:
    larger = e.where(e.lt(a, b), b, a)      # already a when a is NaN
    return e.where(e.is_nan(b), b, larger) if dtype.is_float else larger


def _mulacc(e: _Emitter, dtype: DType, a: int, b: int, c: int) -> int:
    return e.plus(e.mul(a, b), c)


def _recip(e: _Emitter, dtype: DType, a: int) -> int:
    return e.alu(Op.FDIV, e.const(1.0, dtype), a)


@dataclass(frozen=True)
class _Format:
    """The bit layout of float32 or float64, and polynomial lengths that reach its precision."""

    bits: DType          # the signed int of the same size
    mantissa: int        # stored fraction bits
    bias: int
    exp2_terms: int      # Taylor terms of 2^f on [-1/2, 1/2]
    log2_terms: int      # terms of the atanh series on |s| <= 3 - 2*sqrt(2)
    sin_terms: int       # Taylor terms of sin and cos on [-pi/4, pi/4], after the first
    pi_part_bits: int    # significant bits of each pi/2 part but the last (see _sin)
    pi_parts: int        # how many parts: enough bits of pi/2 for the accurate range
    quadrants: float     # |k| below which r stays within about pi/4 (k * part nearly exact);
                         # float32 hands |a| >= 2^20 (k < 2^20) to Payne-Hanek before that


_FORMATS = {
    dtypes.float32: _Format(dtypes.int32, 23, 127, 8, 5, 5, 3, 7, 2.0 ** 22),
    dtypes.float64: _Format(dtypes.int64, 52, 1023, 14, 11, 8, 21, 4, 2.0 ** 30),
}


def _via_float32(rule: Rule) -> Rule:
    """float16 and bfloat16 run `rule` in float32 and round once at the end."""
    def narrow_or_wide(e: _Emitter, dtype: DType, *src: int) -> int:
        if dtype in _FORMATS:
            return rule(e, dtype, *src)
        wide = rule(e, dtypes.float32, *(e.cast(s, dtypes.float32) for s in src))
        return e.cast(wide, dtype)
    return narrow_or_wide


@_via_float32
def _trunc(e: _Emitter, dtype: DType, a: int) -> int:
    # Floats of magnitude >= 2^mantissa are integers already; smaller ones fit the int type.
    fmt = _FORMATS[dtype]
    small = e.inside(a, 2.0 ** fmt.mantissa)
    whole = e.cast(e.cast(e.where(small, a, e.const(0.0, dtype)), fmt.bits), dtype)
    # The cast loses the sign of -0.5 -> -0; put the sign bit of a back.
    sign = e.alu(Op.AND, e.cast(a, fmt.bits, bitcast=True), e.const(fmt.bits.min, fmt.bits))
    signed = e.alu(Op.OR, e.cast(whole, fmt.bits, bitcast=True), sign)
    return e.where(small, e.cast(signed, dtype, bitcast=True), a)


def _power_of_two(e: _Emitter, dtype: DType, k: int) -> int:
    """2^k for an int32 k in the normal exponent range, built from its exponent bits."""
    fmt = _FORMATS[dtype]
    biased = e.offset(e.cast(k, fmt.bits), fmt.bias)
    return e.cast(e.alu(Op.SHL, biased, e.const(fmt.mantissa, fmt.bits)), dtype, bitcast=True)


@_via_float32
def _exp2(e: _Emitter, dtype: DType, a: int) -> int:
    fmt = _FORMATS[dtype]
    # Past these bounds 2^a is inf or rounds to 0; clamping keeps the int cast defined.
    low, high = -(fmt.bias + fmt.mantissa + 2), fmt.bias + 2
    x = e.where(e.is_nan(a), e.const(0.0, dtype), a)
    x = e.where(e.lt(x, e.const(low, dtype)), e.const(low, dtype), x)
    x = e.where(e.lt(e.const(high, dtype), x), e.const(high, dtype), x)
    # a = k + f with k integral, |f| <= 1/2; each step below is exact.
    k = e.cast(x, dtypes.int32)
    f = e.sub(x, e.cast(k, dtype))
    up, down = e.lt(e.const(0.5, dtype), f), e.lt(f, e.const(-0.5, dtype))
    k = e.where(up, e.offset(k, 1), e.where(down, e.offset(k, -1), k))
    f = e.where(up, e.offset(f, -1.0), e.where(down, e.offset(f, 1.0), f))
    ln2 = math.log(2.0)
    p = e.poly(f, [ln2 ** n / math.factorial(n) for n in range(fmt.exp2_terms)])
    # Scale in two halves so that neither power overflows and a subnormal result rounds once.
    half = e.alu(Op.SHR, k, e.const(1, dtypes.int32))
    scaled = e.mul(e.mul(p, _power_of_two(e, dtype, half)),
                   _power_of_two(e, dtype, e.sub(k, half)))
    return e.where(e.is_nan(a), a, scaled)


@_via_float32
def _log2(e: _Emitter, dtype: DType, a: int) -> int:
    fmt, bits = _FORMATS[dtype], _FORMATS[dtype].bits
    # Subnormals: scale into the normal range first, subtract the scale from the exponent.
    subnormal = e.lt(a, e.const(2.0 ** (1 - fmt.bias), dtype))
    x = e.where(subnormal, e.scale(a, 2.0 ** fmt.mantissa), a)
    shift = e.where(subnormal, e.const(fmt.mantissa, bits), e.const(0, bits))
    # a = m * 2^k with m in [1, 2), from the bits; then m in [sqrt(1/2), sqrt(2)).
    raw = e.cast(x, bits, bitcast=True)
    k = e.sub(e.alu(Op.SHR, raw, e.const(fmt.mantissa, bits)), e.offset(shift, fmt.bias))
    fraction = e.alu(Op.AND, raw, e.const((1 << fmt.mantissa) - 1, bits))
    one = e.const(fmt.bias << fmt.mantissa, bits)
    m = e.cast(e.alu(Op.OR, fraction, one), dtype, bitcast=True)
    big = e.lt(e.const(math.sqrt(2.0), dtype), m)
    m, k = e.where(big, e.scale(m, 0.5), m), e.where(big, e.offset(k, 1), k)
    # log2(m) = 2/ln2 * atanh(s) = 2/ln2 * (s + s^3/3 + s^5/5 + ...), s = (m-1)/(m+1).
    s = e.alu(Op.FDIV, e.offset(m, -1.0), e.offset(m, 1.0))
    series = e.poly(e.mul(s, s), [2 / math.log(2.0) / (2 * n + 1) for n in range(fmt.log2_terms)])
    y = e.plus(e.cast(k, dtype), e.mul(s, series))
    zero, inf = e.const(0.0, dtype), e.const(math.inf, dtype)
    y = e.where(e.lt(a, inf), y, a)                              # inf and NaN give themselves
    y = e.where(e.alu(Op.CMPNE, a, zero), y, e.const(-math.inf, dtype))
    return e.where(e.lt(a, zero), e.const(math.nan, dtype), y)


_PI = Fraction("3.14159265358979323846264338327950288419716939937510582097494459230781640628")


def _split(value: Fraction, part_bits: int, parts: int, dtype: DType) -> list[float]:
    """`value` as a sum of floats: all but the last have `part_bits` significant bits."""
    out = []
    for _ in range(parts - 1):
        exponent = math.frexp(float(value))[1]
        scale = Fraction(2) ** (exponent - part_bits)
        part = round(value / scale) * scale
        out.append(float(part))
        value -= part
    return out + [float(dtype.np.type(float(value)))]


def _sin(e: _Emitter, dtype: DType, a: int) -> int:
    fmt = _FORMATS[dtype]
    # Quadrant k = round(a * 2/pi) in int32 below fmt.quadrants; float32 hands |a| >= 2^20 to
    # Payne-Hanek instead, float64 beyond gives 0 (module docstring).
    t = e.scale(a, 2 / math.pi)
    near = e.inside(a, _PAYNE_HANEK_FROM) if dtype == dtypes.float32 else e.inside(
        t, fmt.quadrants)
    t = e.where(near, t, e.const(0.0, dtype))
    half = e.where(e.lt(t, e.const(0.0, dtype)), e.const(-0.5, dtype), e.const(0.5, dtype))
    k = e.cast(e.plus(t, half), dtypes.int32)
    # Cody-Waite: r = a - k*pi/2 with pi/2 in parts; k * part is exact while k has at most
    # (precision - pi_part_bits) bits, so the first subtractions cancel without error.
    k_float, r = e.cast(k, dtype), e.where(near, a, e.const(0.0, dtype))
    for part in _split(_PI / 2, fmt.pi_part_bits, fmt.pi_parts, dtype):
        r = e.sub(r, e.scale(k_float, part))
    finite = near
    if dtype == dtypes.float32:
        # in a branch, which a GPU skips where no lane of a group needs it: it has 3x the
        # ops of the rest (lavapipe runs both sides: sin takes 2x as long there)
        finite = e.inside(a, math.inf)
        k, r = e.acc(k), e.acc(r)
        with e.branch(e.alu(Op.XOR, near, e.const(True, dtypes.bool_))):
            far_k, far_r = _payne_hanek(e, e.where(near, e.const(_PAYNE_HANEK_FROM, dtype), a))
            e.assign(k, far_k)
            e.assign(r, far_r)
    r2 = e.mul(r, r)
    sin_series = [(-1) ** n / math.factorial(2 * n + 1) for n in range(1, fmt.sin_terms + 1)]
    cos_series = [(-1) ** n / math.factorial(2 * n) for n in range(1, fmt.sin_terms + 1)]
    sin_r = e.plus(r, e.mul(e.mul(r, r2), e.poly(r2, sin_series)))
    cos_r = e.offset(e.mul(r2, e.poly(r2, cos_series)), 1.0)
    # sin(r + k*pi/2) is sin r, cos r, -sin r, -cos r for k mod 4 = 0, 1, 2, 3.
    def bit(mask: int) -> int:
        return e.alu(Op.CMPNE, e.alu(Op.AND, k, e.const(mask, dtypes.int32)),
                     e.const(0, dtypes.int32))
    value = e.where(bit(1), cos_r, sin_r)
    value = e.where(bit(2), e.alu(Op.NEG, value), value)
    beyond = e.where(e.inside(a, math.inf), e.const(0.0, dtype), e.const(math.nan, dtype))
    return e.where(finite, value, beyond)


# Payne-Hanek for float32 |a| >= 2^20, in 12-bit limbs held in int32 (a product of two limbs
# and the sum of three fit), since WGSL has no 64-bit integers. a = m * 2^e with m < 2^24 and
# -3 <= e <= 104; e + 3 = 12q + s. Then a * 2/pi mod 4 = (m << s) * X_q / 2^94 mod 4 up to
# 2^-59, where X_q = floor(2/pi * 2^(12q + 91)) mod 2^96: limbs 8 - q to 15 - q of _TWO_BY_PI,
# 2/pi in 187 bits. The exact product's two top bits are the quadrant, the rest the fraction.
_PAYNE_HANEK_FROM = 2.0 ** 20
_LIMB, _LIMB_MASK = 12, 0xFFF
_TWO_BY_PI_BITS = 187
_TWO_BY_PI = [(math.floor(2 / _PI * 2 ** _TWO_BY_PI_BITS) >> (_LIMB * n)) & _LIMB_MASK
              for n in range(16)]


def _payne_hanek(e: _Emitter, a: int) -> tuple[int, int]:
    """(k, r) with a = k * pi/2 + r, |r| <= pi/4, for a float32 a with 2^20 <= |a| < inf."""
    i32 = dtypes.int32

    def c(value: int) -> int:
        return e.const(value, i32)

    def shr(x: int, n: int) -> int:
        return e.alu(Op.SHR, x, n)

    def low(x: int) -> int:
        return e.alu(Op.AND, x, c(_LIMB_MASK))

    bits = e.cast(a, i32, bitcast=True)
    exponent = e.offset(e.alu(Op.AND, shr(bits, c(23)), c(0xFF)), -150 + 3)    # e + 3, in [0, 107]
    q, s = e.alu(Op.IDIV, exponent, c(_LIMB)), e.alu(Op.MOD, exponent, c(_LIMB))
    m = e.alu(Op.OR, e.alu(Op.AND, bits, c(0x7FFFFF)), c(0x800000))
    # m << s in three limbs, without forming the 36-bit value
    m_low, m_high = e.alu(Op.SHL, low(m), s), e.alu(Op.SHL, shr(m, c(_LIMB)), s)
    m_limbs = [low(m_low), e.alu(Op.OR, shr(m_low, c(_LIMB)), low(m_high)),
               shr(m_high, c(_LIMB))]
    # X_q's limbs, picked by q among the 9 windows of _TWO_BY_PI
    x_limbs = [c(_TWO_BY_PI[j + 8]) for j in range(8)]
    for window in range(1, 9):
        other = e.alu(Op.CMPNE, q, c(window))
        x_limbs = [e.where(other, x, c(_TWO_BY_PI[j + 8 - window]))
                   for j, x in enumerate(x_limbs)]
    # (m << s) * X_q mod 2^96, column by column with carries
    product, carry = [], c(0)
    for column in range(8):
        total = carry
        for i, m_limb in enumerate(m_limbs):
            if column - i >= 0:
                total = e.plus(total, e.mul(m_limb, x_limbs[column - i]))
        product.append(low(total))
        carry = shr(total, c(_LIMB))
    # round to the nearest quadrant: add half a quadrant (bit 93, bit 9 of the top limb)
    top = low(e.offset(product[7], 1 << 9))
    k = shr(top, c(10))
    fraction = e.alu(Op.AND, top, c(0x3FF))
    # fraction + 2^93 below the quadrant bits: |r| is its distance from 2^93, by flipping bits
    negative = e.lt(fraction, c(1 << 9))
    limbs = [e.alu(Op.XOR, limb, e.where(negative, c(_LIMB_MASK), c(0)))
             for limb in product[:7]]
    limbs.append(e.alu(Op.XOR, fraction, e.where(negative, c(0x1FF), c(0x200))))
    # 24-bit pairs are exact in float32; summed smallest first, times pi/2 / 2^94
    f32 = dtypes.float32
    magnitude = e.const(0.0, f32)
    for pair in range(4):
        joined = e.alu(Op.OR, e.alu(Op.SHL, limbs[2 * pair + 1], c(_LIMB)), limbs[2 * pair])
        magnitude = e.plus(magnitude, e.scale(e.cast(joined, f32), 2.0 ** (24 * pair - 94)))
    r = e.scale(magnitude, math.pi / 2)
    # a < 0: -a = -k * pi/2 - r
    flip = e.alu(Op.XOR, negative, e.lt(a, e.const(0.0, f32)))
    k = e.where(e.lt(a, e.const(0.0, f32)), e.alu(Op.NEG, k), k)
    return k, e.where(flip, e.alu(Op.NEG, r), r)


DECOMPOSITIONS: dict[Op, Rule] = {
    Op.NEG: _neg,
    Op.SUB: _sub,
    Op.MAX: _max,
    Op.MULACC: _mulacc,
    Op.RECIP: _recip,
    Op.TRUNC: _trunc,
    Op.EXP2: _exp2,
    Op.LOG2: _log2,
    Op.SIN: _via_float32(_sin),
}
