"""The exponential and the functions made of it: exp, sigmoid, tanh, erf and erfc.

The ABI's EXP2 is exp2 of any float; e ** x through it lost up to 59 ulp in float32, so `exp`
reduces x by Cody-Waite first and evaluates 2^f on [-1/2, 1/2] with pk_exp2f's polynomial
(codegen/exp2f.py). Each is a composition of elementwise ops, recorded once (`Composition`),
with its gradient given beside it.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from portkit.codegen.exp2f import POLYNOMIAL
from portkit.tensor.composition import Composition
from portkit.tensor.dtype import float32, int32, int64
from portkit.tensor.elementwise import in_float32

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# erf(x) = 2/sqrt(pi) * x * sum of these times x**2n, highest power first (|x| < 0.5: 1e-8)
_ERF_SERIES = tuple((-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in reversed(range(7)))
# Cephes tanhf: tanh(x) = x + x * z * poly(z), z = x * x, for |x| < 0.625
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)
# Numerical Recipes' erfcc: erfc(z) = t * exp(-z*z + poly(t)), t = 1 / (1 + z/2), z >= 0
_ERFC_CHEBYSHEV = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
                   0.09678418, 0.37409196, 1.00002368, -1.26551223)


class ExponentialOps:
    """Tensor's exp, sigmoid, tanh, erf and erfc."""

    __slots__ = ()

    @in_float32
    def exp(self: Tensor) -> Tensor:
        """e ** self, within a few ulp: exp2 of the rounded x * log2(e) lost up to 59 ulp in
        float32 (399 in float64), so x is reduced by Cody-Waite to r = x - k ln2 first."""
        x = self._float()
        value = _EXP(x.detach())
        return value._with_grad((x, value))

    @in_float32
    def sigmoid(self: Tensor) -> Tensor:
        """1 / (1 + e ** -self). Its derivative is given (`_logistic`): backward adds one
        multiply, not the gradients of the eight ops of the value."""
        x = self._float()
        value, slope = _LOGISTIC.parts(x.detach())
        return value._with_grad((x, slope))

    @in_float32
    def _exp_of_nonpositive(self: Tensor) -> Tensor:
        """`exp` of a tensor whose elements are below ln2 / 2 (those <= 0, say) or NaN: the
        same values, in fewer ops (`_exp`'s `nonpositive`)."""
        x = self._float()
        value = _EXP_OF_NONPOSITIVE(x.detach())
        return value._with_grad((x, value))

    @in_float32
    def tanh(self: Tensor) -> Tensor:
        """The hyperbolic tangent. Its derivative, 4 sigmoid'(2x), is given: backward adds one
        multiply, not the gradients of the polynomial and the sigmoid."""
        x = self._float()
        value, slope = _TANH.parts(x.detach())
        return value._with_grad((x, slope))

    @in_float32
    def erf(self: Tensor) -> Tensor:
        """The error function (absolute error below 2e-7 in float32)."""
        x = self._float()
        # near 0, 1 - erfc cancels: the Taylor series keeps the relative accuracy there
        x2 = x * x
        series = x2 * _ERF_SERIES[0] + _ERF_SERIES[1]
        for c in _ERF_SERIES[2:]:
            series = x2 * series + c
        small = x * series * (2 / math.sqrt(math.pi))
        return (x.abs() < 0.5)._where(small, 1 - x.erfc())

    @in_float32
    def erfc(self: Tensor) -> Tensor:
        """1 - erf(x), accurate to a relative 1.2e-7 (Numerical Recipes' erfcc, Chebyshev)."""
        x = self._float()
        z = x.abs()
        t = 1 / (1 + 0.5 * z)
        poly = t * _ERFC_CHEBYSHEV[0] + _ERFC_CHEBYSHEV[1]
        for c in _ERFC_CHEBYSHEV[2:]:
            poly = t * poly + c
        tail = t * (poly - z * z)._exp_of_nonpositive()      # at most 0 (+3e-8 in float64)
        return (x < 0)._where(2 - tail, tail)


def _exp(x: Tensor, nonpositive: bool = False) -> Tensor:
    """e ** x = 2^k e^r, k = round(x / ln2), r = x - k ln2 with ln2 in two parts: k * high
    part is exact and r, |r| <= ln2 / 2, loses nothing, so 2^(r log2 e) errs by < 1 ulp: in
    float32 EXP2's polynomial on [-1/2, 1/2] (exp2f.py), not EXP2, which reduces again.
    `nonpositive`: every x is <= 0 (a sigmoid's e ** -|x|), or at least below ln2 / 2, where k
    is 0 either way, or NaN; that saves an upper clip, a sign test in the rounding and a split
    of 2^k: the same values, a fifth fewer ops."""
    high, low, limit, bits, mantissa, bias = _EXP_PARTS[x.dtype.name]
    x = x.clip(-limit, None if nonpositive else limit)  # past these e^x is 0 or inf
    t = x * (1 / math.log(2))
    # rounded half away from 0; NaN gives any k
    k = (t - 0.5 if nonpositive else t + (t < 0)._where(-0.5, 0.5)).cast(bits)
    k_float = k.cast(x.dtype)
    r = (x - k_float * high) - k_float * low
    f = r * (1 / math.log(2))
    power = f.exp2() if x.dtype != float32 else functools.reduce(
        lambda p, c: p * f + c, POLYNOMIAL[2:], f * POLYNOMIAL[0] + POLYNOMIAL[1])
    # 2^k as two normal floats built from their exponent bits (cheaper than EXP2): e^r times
    # the first is exact, and the second product rounds once even when the result is
    # subnormal. For k <= 0 the two are 2^(k + shift) and the constant 2^-shift.
    if nonpositive:
        shift = (bias + 1) // 2
        return power * ((k + (bias + shift)) << mantissa).bitcast(x.dtype) * 2.0 ** -shift
    half = k >> 1
    scale = [((h + bias) << mantissa).bitcast(x.dtype) for h in (half, k - half)]
    return power * scale[0] * scale[1]


_EXP = Composition(_exp)
_EXP_OF_NONPOSITIVE = Composition(functools.partial(_exp, nonpositive=True))

# ln2 as high + low: high has few enough bits (9, 33) that k * high is exact for every k the
# clipped argument gives (past the limit e^x overflows or is 0); then the float's int type,
# mantissa bits and exponent bias
_EXP_PARTS = {"float32": (0.693359375, -2.12194440e-4, 110.0, int32, 23, 127),
              "float64": (6.93147180369123816490e-01, 1.90821492927058770002e-10, 760.0,
                          int64, 52, 1023)}


def _logistic(x: Tensor) -> tuple[Tensor, Tensor]:
    """sigmoid(x) and its derivative e ** -|x| / (1 + e ** -|x|) ** 2, of a float tensor
    without gradient. e ** -|x| never overflows, so neither meets inf * 0 (NaN); x < 0 is one
    comparison where x >= 0 is three (NaN gives NaN either way)."""
    negative = x < 0
    e = negative._where(x, -x)._exp_of_nonpositive()
    r = 1 / (1 + e)          # one division per element, not one per branch
    er = e * r
    return negative._where(er, r), er * r


def _tanh(x: Tensor) -> tuple[Tensor, Tensor]:
    """tanh(x) and its derivative, 4 sigmoid'(2x), of a float tensor without gradient."""
    # near 0, 2 * sigmoid(2x) - 1 cancels (tanh(1e-8) gave 0): Cephes' tanhf polynomial there,
    # fed 0 where not selected so its large-x overflow yields no NaN
    small = (x < 0.625) & (x > -0.625)
    xs = small._where(x, 0.0)
    z = xs * xs
    poly = z * _TANH_POLY[0] + _TANH_POLY[1]
    for c in _TANH_POLY[2:]:
        poly = poly * z + c
    logistic, slope = _logistic(2 * x)
    # sech(x) ** 2 without the cancellation of 1 - tanh(x) ** 2 where tanh rounds to 1
    return small._where(xs + xs * z * poly, 2 * logistic - 1), 4 * slope


# sigmoid's and tanh's values and derivatives: about 30 and 60 nodes, copied in one pass
_LOGISTIC = Composition(_logistic)
_TANH = Composition(_tanh)
