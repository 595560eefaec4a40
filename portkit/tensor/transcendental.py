"""Inverse trigonometric and hyperbolic functions, and the float helpers PyTorch code calls
beside them (log10, logaddexp, fmod, copysign, lerp, isclose).

The ABI has only EXP2, LOG2 and SIN, so these are compositions: Cephes' float32 argument
reductions and polynomials. A branch that `where` does not select still gets a zero gradient,
and 0 * inf is NaN, so each branch reads a safe stand-in wherever it is not selected.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from portkit.tensor.dtype import Scalar
from portkit.tensor.elementwise import in_float32, pair_in_float32

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# Cephes atanf: atan(t) = t + t * z * poly(z), z = t * t, for |t| <= tan(pi / 8)
_ATAN_POLY = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_TAN_PI_8 = math.tan(math.pi / 8)


def _as_tensor(like: Tensor, value: Tensor | Scalar) -> Tensor:
    return value if isinstance(value, type(like)) else like.full_like(value)


class TranscendentalOps:
    """Tensor's atan, atan2, asin, acos, sinh, cosh, asinh, acosh, atanh, log1p, log10,
    logaddexp, fmod, copysign, lerp, isclose."""

    __slots__ = ()

    @in_float32
    def atan(self: Tensor) -> Tensor:
        """The arctangent, in (-pi/2, pi/2)."""
        x = self._float()
        a = _magnitude(x)
        big, mid = a > 1 / _TAN_PI_8, a > _TAN_PI_8
        # atan(a) = pi/2 - atan(1/a) = pi/4 + atan((a-1)/(a+1)) bring a to |t| <= tan(pi/8)
        t = big._where(-1 / big._where(a, 1.0), mid._where(
            (a - 1) / (mid._where(a, 0.0) + 1), a))
        z = t * t
        poly = z * _ATAN_POLY[0] + _ATAN_POLY[1]
        for c in _ATAN_POLY[2:]:
            poly = poly * z + c
        base = big._where(math.pi / 2, mid._where(math.pi / 4, 0.0))
        out = base + t + t * z * poly
        return (x < 0)._where(-out, out)

    @pair_in_float32
    def atan2(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """The angle of the point (other, self), in [-pi, pi] (torch.atan2(self, other))."""
        y, x = self._float()._operand(other)
        if y.requires_grad or x.requires_grad:
            # torch's gradient, (x, -y) / (x^2 + y^2), and 0 at the origin, where through
            # the formula it was 1 or -1
            b, a = y.detach(), x.detach()
            square = a * a + b * b
            inverse = (square == 0)._where(0.0, 1 / square)
            return b.atan2(a)._with_grad((y, a * inverse), (x, -b * inverse))
        ay, ax = _magnitude(y), _magnitude(x)
        steep = ay > ax
        hi = steep._where(ay, ax)
        lo = steep._where(ax, ay)
        # both infinite: the diagonal (ratio 1), where inf / inf would be NaN
        both_inf = ax.isinf() & ay.isinf()
        ratio = both_inf._where(1.0, both_inf._where(0.0, lo) / (hi == 0)._where(1.0, hi))
        r = ratio.atan()
        r = steep._where(math.pi / 2 - r, r)
        r = _signbit(x)._where(math.pi - r, r)
        return _signbit(y)._where(-r, r)

    @in_float32
    def asin(self: Tensor) -> Tensor:
        """The arcsine, in [-pi/2, pi/2] (NaN outside [-1, 1])."""
        x = self._float()
        return x.atan2((1 - x * x).sqrt())

    @in_float32
    def acos(self: Tensor) -> Tensor:
        """The arccosine, in [0, pi] (NaN outside [-1, 1])."""
        x = self._float()
        return (1 - x * x).sqrt().atan2(x)

    @in_float32
    def sinh(self: Tensor) -> Tensor:
        """The hyperbolic sine (a Taylor series near 0, where e^x - e^-x cancels)."""
        x = self._float()
        small = x.abs() < 0.5
        xs = small._where(x, 0.0)
        x2 = xs * xs
        series = xs * (1 + x2 * (1 / 6 + x2 * (1 / 120 + x2 * (1 / 5040))))
        e = x.exp()
        return small._where(series, (e - 1 / e) * 0.5)

    @in_float32
    def cosh(self: Tensor) -> Tensor:
        """The hyperbolic cosine."""
        e = self._float().exp()
        return (e + 1 / e) * 0.5

    @in_float32
    def log1p(self: Tensor) -> Tensor:
        """log(1 + self), accurate where self is tiny (log(1 + x) rounds 1 + x first)."""
        x = self._float()
        value = _log1p(x.detach())
        return value._with_grad((x, 1 / (x.detach() + 1)))

    @in_float32
    def asinh(self: Tensor) -> Tensor:
        """The inverse hyperbolic sine."""
        x = self._float()
        a = x.detach().abs()
        # log1p(a + a^2 / (1 + sqrt(1 + a^2))) near 0; log(2a) where a^2 would overflow
        big = a > 2.0 ** 28
        small = big._where(0.0, a)
        near = _log1p(small + small * small / (1 + (small * small + 1).sqrt()))
        value = big._where(a.log() + math.log(2), near)
        value = (x < 0)._where(-value, value)
        return value._with_grad((x, (x.detach() * x.detach() + 1).rsqrt()))

    @in_float32
    def acosh(self: Tensor) -> Tensor:
        """The inverse hyperbolic cosine (NaN below 1)."""
        x = self._float()
        a = x.detach()
        big = a > 2.0 ** 28
        t = big._where(0.0, a - 1)
        # log1p(t + sqrt(2t + t^2)), t = x - 1, keeps the accuracy near 1
        near = _log1p(t + (t * 2 + t * t).sqrt())
        value = (a < 1)._where(float("nan"), big._where(a.log() + math.log(2), near))
        return value._with_grad((x, (a * a - 1).rsqrt()))

    @in_float32
    def atanh(self: Tensor) -> Tensor:
        """The inverse hyperbolic tangent (+-inf at +-1, NaN beyond)."""
        x = self._float()
        a = x.detach().abs()
        value = _log1p(a * 2 / (1 - a)) * 0.5
        value = (a > 1)._where(float("nan"), (x < 0)._where(-value, value))
        return value._with_grad((x, 1 / (1 - x.detach() * x.detach())))

    @in_float32
    def log10(self: Tensor) -> Tensor:
        """The base-10 logarithm."""
        return self.log2() * math.log10(2)

    @pair_in_float32
    def logaddexp(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """log(e^self + e^other), without overflow."""
        a, b = self._float()._operand(other)
        same = a == b                   # also both -inf or both +inf, where a - b is NaN
        m = a.maximum(b)
        d = same._where(0.0, a - b).abs()
        return same._where((a + b) * 0.5 + math.log(2), m + (1 + (-d)._exp_of_nonpositive()).log())

    def fmod(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """The remainder of self / other with self's sign (C's fmod; % takes other's sign)."""
        a, b = self._operand(other)
        if not a.dtype.is_float:
            return a._int_divide("mod", b)
        return a - (a / b).trunc() * b

    def copysign(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """|self| with the sign of other (-0.0 counts as negative)."""
        a, b = self._float()._operand(other)
        return _signbit(b)._where(-a.abs(), a.abs())

    def lerp(self: Tensor, end: Tensor | Scalar, weight: Tensor | Scalar) -> Tensor:
        """self + weight * (end - self)."""
        return self + (_as_tensor(self, end) - self) * weight

    def isclose(self: Tensor, other: Tensor | Scalar, rtol: float = 1e-5, atol: float = 1e-8,
                equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol * |other|, elementwise (infinities equal only
        themselves)."""
        a, b = self._operand(other)
        if not a.dtype.is_float:
            return a == b
        finite = a.isfinite() & b.isfinite()
        close = (a == b) | (finite & ((a - b).abs() <= atol + rtol * b.abs()))
        return close | (a.isnan() & b.isnan()) if equal_nan else close


def _log1p(x: Tensor) -> Tensor:
    """log(1 + x) to a few ulp: for |x| < 1/2, 2 atanh(s) = 2 (s + s^3/3 + ...) with
    s = x / (2 + x), since 1 + x rounds and a device's log may be only absolutely accurate
    near 1 (WGSL's); log(1 + x) elsewhere."""
    small = x.abs() < 0.5
    s = small._where(x, 0.0) / (small._where(x, 0.0) + 2)
    z = s * s
    series = z * (1 / 17) + 1 / 15
    for n in range(6, -1, -1):
        series = series * z + 1 / (2 * n + 1)
    return small._where(s * series * 2, (x + 1).log())


def _magnitude(x: Tensor) -> Tensor:
    """|x| whose gradient at 0 is 1, not abs()'s 0: atan and atan2 have slope there."""
    return (x < 0)._where(-x, x)


def _signbit(x: Tensor) -> Tensor:
    """True where x is negative, -0.0 included (1 / -0.0 is -inf)."""
    zero = x == 0
    return (x < 0) | (zero & (1 / zero._where(x, 1.0) < 0))
