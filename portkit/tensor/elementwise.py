"""Elementwise math: casts, dtype promotion and broadcasting of operands, unary and binary ops.

Each op is a composition of autograd primitives (`_prim`), so it is differentiable wherever they
are; integer semantics follow Python and PyTorch where the ABI's follow C.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from portkit import graph
from portkit.tensor.broadcast import broadcast, wrapped
from portkit.tensor.dtype import (
    DTypeLike,
    Scalar,
    bfloat16,
    bool_,
    check_dtype,
    default_float,
    float16,
    float32,
    float_of,
    int32,
    promote_tensors,
    scalar_dtype,
    to_dtype,
)
from portkit.tensor.power import MULTIPLIED, real_pow, scalar_pow

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

_HALF = (float16, bfloat16)
_HALF_NAMES = frozenset(d.name for d in _HALF)


def in_float32(method: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A float function of a 16-bit float tensor (and options) computed in float32 and rounded
    once: its approximations (polynomials, exp2 of a product) lose 10 to 2400 ulp in 16 bits."""
    @functools.wraps(method)
    def wrapper(self: Tensor, *args, **kwargs) -> Tensor:
        if self.dtype in _HALF:
            return method(self.cast(float32), *args, **kwargs).cast(self.dtype)
        return method(self, *args, **kwargs)
    return wrapper


def pair_in_float32(method: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """in_float32 for a function of two operands whose result is 16-bit: a number is rounded to
    that dtype first, as torch wraps it in a tensor (pow, atan2, logaddexp)."""
    @functools.wraps(method)
    def wrapper(self: Tensor, other: Tensor | Scalar, *args, **kwargs) -> Tensor:
        tensor = isinstance(other, type(self))
        dtype = promote_tensors(self, other) if tensor else self.dtype
        if dtype not in _HALF or not (tensor or isinstance(other, float | int)):
            return method(self, other, *args, **kwargs)
        if tensor:
            other = other.cast(float32)
        elif isinstance(other, float):
            other = float(np.array(other, np.float32).astype(dtype.np))
        return method(self.cast(float32), other, *args, **kwargs).cast(dtype)
    return wrapper


_BOOL_ARITHMETIC = {"add": "or", "mul": "and"}
_NUMPY_VALUES = (np.ndarray, np.generic)
_INTEGER_ONLY = frozenset({"and", "or", "xor", "shl", "shr"})


class ElementwiseOps:
    """Tensor's elementwise ops; the operators (+, <, ...) in core.py call these."""

    __slots__ = ()

    # -- dtypes -------------------------------------------------------------------------------

    def cast(self: Tensor, dtype: DTypeLike) -> Tensor:
        """The values converted to `dtype` (self if it already is)."""
        if dtype is self.lazy.dtype:
            return self
        dtype = to_dtype(dtype)
        if dtype == self.dtype:
            return self
        return self._prim("cast", arg=check_dtype(dtype, self.device))

    def bitcast(self: Tensor, dtype: DTypeLike) -> Tensor:
        """The same bits read as `dtype`, which must have the same size."""
        dtype = to_dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise TypeError(f"bitcast from {self.dtype.name} to {dtype.name}: sizes differ")
        return self._prim("bitcast", arg=check_dtype(dtype, self.device))

    def float(self: Tensor) -> Tensor:
        """Cast to float32."""
        return self.cast(float32)

    def int(self: Tensor) -> Tensor:
        """Cast to int32."""
        return self.cast(int32)

    def _float(self: Tensor) -> Tensor:
        return self.cast(float_of(self.dtype))

    def _operand(self: Tensor, other: Tensor | Scalar, reverse: bool = False
                 ) -> tuple[Tensor, Tensor]:
        """self and other promoted to one dtype and broadcast to one shape (swapped if reverse)."""
        Tensor, lazy = type(self), self.lazy
        tensor = isinstance(other, Tensor)
        if not tensor and isinstance(other, _NUMPY_VALUES):
            other = Tensor(other, device=lazy.device) if other.ndim else other.item()
            tensor = isinstance(other, Tensor)
        if tensor:
            graph.check_devices(lazy, (other.lazy,))
            dtype = promote_tensors(self, other)
            a, b = self.cast(dtype), other.cast(dtype)
            if a.lazy.shape != b.lazy.shape:
                a, b = broadcast(a, b)
            return (b, a) if reverse else (a, b)
        dtype = lazy.dtype
        if isinstance(other, float) and dtype.kind != "float":
            dtype = check_dtype(default_float, lazy.device)
        elif isinstance(other, int) and not isinstance(other, bool) and dtype.kind == "bool":
            dtype = check_dtype(int32, lazy.device)
        # made at self's shape at once: the same constant node a reshape and an expand of a 0-d
        # one would give, without building them on every scalar operation
        other = self._wrap(graph.shared_const(wrapped(other, dtype), dtype, lazy.shape,
                                              lazy.device))
        a = self if dtype is lazy.dtype else self.cast(dtype)
        return (other, a) if reverse else (a, other)

    def _binary(self: Tensor, name: str, other: Tensor | Scalar, reverse: bool = False
                ) -> Tensor:
        if name == "mul" and _in_opmath(self, other):
            return self.float()._binary(name, _number(other)).cast(self.dtype)
        a, b = self._operand(other, reverse)
        if name in _INTEGER_ONLY and a.dtype.is_float:
            raise TypeError(f"{name} is defined on integer and bool tensors, not "
                            f"{a.dtype.name}; cast with .int() first")
        if a.dtype.kind == "bool":
            # the ABI has no bool ADD/MUL; on bools they are or/and (PyTorch's results)
            name = _BOOL_ARITHMETIC.get(name, name)
            if name == "sub":
                raise TypeError("subtraction of bool tensors is not supported (as in PyTorch); "
                                "use ^ or logical_not() instead")
        return a._prim(name, b)

    # -- arithmetic ---------------------------------------------------------------------------

    def add(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self + other (logical or for two bools, as PyTorch)."""
        return self._binary("add", other)

    def sub(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self - other."""
        return self._binary("sub", other)

    def mul(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self * other (logical and for two bools, as PyTorch)."""
        return self._binary("mul", other)

    def div(self: Tensor, other: Tensor | Scalar, reverse: bool = False,
            rounding_mode: str | None = None) -> Tensor:
        """self / other in floating point (other / self if reverse); rounding_mode "trunc" or
        "floor" rounds the quotient and keeps integer dtypes, as torch.div. An integer zero
        divisor the host holds raises ZeroDivisionError; one computed on the device gives 0."""
        if rounding_mode == "floor":
            return self._floordiv(other, reverse)
        if rounding_mode == "trunc":
            _check_int_divisor(self, other, reverse)
            a, b = self._operand(other, reverse)
            return (a / b).trunc() if a.dtype.is_float else a._int_divide("idiv", b)
        if rounding_mode is not None:
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                             f"{rounding_mode!r}")
        if _in_opmath(self, other):
            # torch: number / x is the 16-bit reciprocal times the number
            if reverse:
                return self.reciprocal() * _number(other)
            return (self.float() / _number(other)).cast(self.dtype)
        a, b = self._operand(other, reverse)
        return a._float()._prim("div", b._float())

    def _floordiv(self: Tensor, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
        _check_int_divisor(self, other, reverse)
        a, b = self._operand(other, reverse)
        if a.dtype.is_float:
            return (a / b).floor()
        # IDIV truncates; Python and PyTorch round toward negative infinity
        fix = ((a._int_divide("mod", b) != 0) & ((a < 0) ^ (b < 0))).cast(a.dtype)
        return a._int_divide("idiv", b) - fix

    def _mod(self: Tensor, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
        _check_int_divisor(self, other, reverse)
        a, b = self._operand(other, reverse)
        if a.dtype.is_float:
            return a - (a / b).floor() * b
        r = a._int_divide("mod", b)
        return (r != 0)._where(((r < 0) ^ (b < 0))._where(r + b, r), r)

    def _int_divide(self: Tensor, name: str, divisor: Tensor) -> Tensor:
        """IDIV or MOD of integer tensors of one shape, 0 where the divisor is 0 (numpy's
        result; the ABI leaves it unspecified, and PyTorch's error needs the divisor on the
        host: a zero the host holds raises ZeroDivisionError before this)."""
        zero = divisor == 0
        return zero._where(0, self._prim(name, zero._where(1, divisor)))

    def neg(self: Tensor) -> Tensor:
        """-self (logical not for bool)."""
        return self._prim("neg") if self.dtype != bool_ else ~self

    def reciprocal(self: Tensor) -> Tensor:
        """1 / self."""
        return self._float()._prim("recip")

    def sqrt(self: Tensor) -> Tensor:
        """The square root."""
        return self._float()._prim("sqrt")

    @in_float32
    def rsqrt(self: Tensor) -> Tensor:
        """1 / sqrt(self)."""
        return self.sqrt().reciprocal()

    @in_float32
    def exp2(self: Tensor) -> Tensor:
        """2 ** self."""
        return self._float()._prim("exp2")

    @in_float32
    def log(self: Tensor) -> Tensor:
        """The natural logarithm."""
        return self._float()._prim("log2") * math.log(2)

    @in_float32
    def log2(self: Tensor) -> Tensor:
        """The base-2 logarithm."""
        return self._float()._prim("log2")

    @in_float32
    def sin(self: Tensor) -> Tensor:
        """The sine (radians)."""
        return self._float()._prim("sin")

    @in_float32
    def cos(self: Tensor) -> Tensor:
        """The cosine (radians), from sines of x, x / 2 and 2x (see _cos)."""
        x = self._float()
        s = x.detach().sin()
        return _cos(x.detach(), s)._with_grad((x, -s))

    @in_float32
    def tan(self: Tensor) -> Tensor:
        """The tangent (radians): sin / cos, relatively accurate near the zeros of cos too."""
        x = self._float()
        s = x.detach().sin()
        value = s / _cos(x.detach(), s)
        return value._with_grad((x, 1 + value * value))

    def relu(self: Tensor) -> Tensor:
        """max(self, 0); NaN and -0.0 stay, and the gradient at 0 is 0, as PyTorch's."""
        x = self.detach()       # the value records no gradient of its own: _with_grad gives it
        value = (x < 0)._where(0, x)
        return value._with_grad((self, (x > 0).cast(x.dtype))) if self.requires_grad else value

    def sign(self: Tensor) -> Tensor:
        """-1, 0 or 1, in self's dtype."""
        return (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)

    def abs(self: Tensor) -> Tensor:
        """The absolute value: 0.0 at -0.0, and the gradient 0 at 0, as PyTorch's."""
        if self.dtype == bool_:
            raise NotImplementedError("abs is not implemented for bool tensors (as in PyTorch); "
                                      "a bool is its own absolute value")
        x = self.detach()
        value = (x <= 0)._where(0 - x, x)      # 0 - x: -0.0 gives 0.0, as 0.0 does
        return value._with_grad((self, x.sign())) if self.requires_grad else value

    @pair_in_float32
    def pow(self: Tensor, exponent: Tensor | Scalar) -> Tensor:
        """self ** exponent, with torch's values and derivatives at 0, -0, inf, -inf and NaN;
        integral number exponents (2, and 2.0 from ONNX's Pow) multiply."""
        if isinstance(exponent, int | float) and not isinstance(exponent, bool):
            base = self if self.dtype.is_float or isinstance(exponent, int) else self._float()
            if base.dtype.is_float:
                value = scalar_pow(base.detach(), exponent)
                if not base.requires_grad:
                    return value
                # torch's derivative, exponent * base ** (exponent - 1) by the same kernel:
                # through 1 / (x * x) the gradient of x ** -2 was -inf * 0 = NaN at 0
                slope = (base.zeros_like() if exponent == 0 else
                         scalar_pow(base.detach(), exponent - 1) * exponent)
                return value._with_grad((base, slope))
            if abs(exponent) <= MULTIPLIED:
                return scalar_pow(base, exponent)
        if isinstance(exponent, type(self)) and not (self.dtype.is_float or
                                                      exponent.dtype.is_float):
            return self._int_pow(exponent)
        x, y = self._float()._operand(exponent)
        value = real_pow(x.detach(), y.detach())
        # torch's derivatives: y * x^(y-1) (0 where y is 0, inf at x = 0 for 0 < y < 1) and
        # x^y * log(x) (0 where x is 0 and y >= 0); through exp2 and log2 they were NaN at 0
        dx = (y == 0)._where(0.0, y * real_pow(x, y - 1))
        dy = ((x == 0) & (y >= 0))._where(0.0, value * x.log())
        return value._with_grad((x, dx), (y, dy))

    def _int_pow(self: Tensor, exponent: Tensor) -> Tensor:
        """Integer ** integer tensor by squaring (exact, wrapping like PyTorch's); negative
        exponents give 0 except for bases 1 and -1."""
        base, e = self._operand(exponent)
        out, square = base.ones_like(), base
        for _ in range(base.dtype.bits):
            out = ((e & 1) == 1)._where(out * square, out)
            square, e = square * square, e >> 1
        e = base._operand(exponent)[1]
        negative = (e < 0) & ~((base == 1) | (base == -1))
        return negative._where(0, out).cast(base.dtype)

    def _with_grad(self: Tensor, *pairs: tuple[Tensor, Tensor]) -> Tensor:
        """These values, whose gradient reaches each x of the (x, derivative) pairs as
        g * derivative: an op computes its value by any formula, its gradient by PyTorch's."""
        if not any(x.requires_grad for x, _ in pairs):
            return self.detach()
        inputs = [t for x, d in pairs for t in (x, d.detach())]
        return self.detach()._prim("given_grad", *inputs)

    def maximum(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """The elementwise larger of self and other."""
        a, b = self._operand(other)
        return a | b if a.dtype == bool_ else a._prim("max", b)

    def minimum(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """The elementwise smaller of self and other."""
        a, b = self._operand(other)
        return a & b if a.dtype == bool_ else a._reversed().maximum(b._reversed())._reversed()

    def _reversed(self: Tensor) -> Tensor:
        # an order-reversing map that cannot overflow: -x for floats, ~x for (unsigned) ints
        return ~self if not self.dtype.is_float else -self

    def clip(self: Tensor, min: Tensor | Scalar | None = None,
             max: Tensor | Scalar | None = None) -> Tensor:
        """self limited to [min, max]; either bound may be None, not both."""
        if min is None and max is None:
            raise RuntimeError("clip: at least one of min and max must not be None")
        out = self
        if min is not None:
            out = (out < min)._where(min, out)
        if max is not None:
            out = (out > max)._where(max, out)
        return out

    clamp = clip

    def where(self: Tensor, condition: Tensor, other: Tensor | Scalar) -> Tensor:
        """self where `condition` (a bool tensor) is true, else `other` (torch's Tensor.where;
        `torch.where(c, x, y)` is `x.where(c, y)`); broadcasts all three."""
        if not isinstance(condition, type(self)):
            raise TypeError(f"where: condition must be a bool Tensor, got "
                            f"{type(condition).__name__}; write x.where(condition, other)")
        if condition.dtype != bool_:
            raise RuntimeError(f"where expected condition to be a boolean tensor, but got a "
                               f"tensor with dtype {condition.dtype.name}; compare it (x > 0) "
                               "or cast it (.bool())")
        return condition._where(self, other)

    def _where(self: Tensor, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
        """a where self (a bool tensor, or one cast to bool) is true, else b; broadcasts all
        three (tinygrad's order, which portkit's own code uses)."""
        if isinstance(a, type(self)):
            x, y = a._operand(b)
        elif isinstance(b, type(self)):
            y, x = b._operand(a)
        else:       # shared_const, as a number another op reads (a full tensor may be realized)
            dtype = check_dtype(scalar_dtype(a), self.device)
            x, y = self._wrap(graph.shared_const(a, dtype, self.shape, self.device))._operand(b)
        cond = self.cast(bool_)
        cond, x = broadcast(cond, x)
        cond, y = broadcast(cond, y)
        x, y = broadcast(x, y)
        cond, x = broadcast(cond, x)
        return cond._prim("where", x, y)

    def trunc(self: Tensor) -> Tensor:
        """Rounds toward zero."""
        return self._prim("trunc") if self.dtype.is_float else self

    def floor(self: Tensor) -> Tensor:
        """Rounds toward negative infinity."""
        t = self.trunc()
        return (t > self)._where(t - 1, t) if self.dtype.is_float else self

    def ceil(self: Tensor) -> Tensor:
        """Rounds toward positive infinity."""
        t = self.trunc()
        return (t < self)._where(t + 1, t) if self.dtype.is_float else self

    def round(self: Tensor) -> Tensor:
        """Rounds half to even, as numpy and PyTorch do."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        d = self - f
        odd = (f - (f * 0.5).floor() * 2) == 1
        return (d > 0.5)._where(f + 1, (d < 0.5)._where(f, odd._where(f + 1, f)))

    def isnan(self: Tensor) -> Tensor:
        """True where self is NaN (the one value unequal to itself)."""
        return self._binary("ne", self) if self.dtype.is_float else self.zeros_like(bool_)

    def isinf(self: Tensor) -> Tensor:
        """True where self is +inf or -inf."""
        if not self.dtype.is_float:
            return self.zeros_like(bool_)
        return (self == float("inf")) | (self == float("-inf"))

    def isfinite(self: Tensor) -> Tensor:
        """True where self is neither NaN nor infinite."""
        return ~(self.isnan() | self.isinf())

    def logical_not(self: Tensor) -> Tensor:
        """True where self is zero or False."""
        return ~self.cast(bool_)

    def logical_and(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """True where both are nonzero."""
        return self.cast(bool_) & _as_bool(self, other)

    def logical_or(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """True where either is nonzero."""
        return self.cast(bool_) | _as_bool(self, other)

    def logical_xor(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """True where exactly one is nonzero."""
        return self.cast(bool_) ^ _as_bool(self, other)

    def bitwise_and(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self & other, on integer and bool tensors."""
        return self & other

    def bitwise_or(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self | other, on integer and bool tensors."""
        return self | other

    def bitwise_xor(self: Tensor, other: Tensor | Scalar) -> Tensor:
        """self ^ other, on integer and bool tensors."""
        return self ^ other

    def bitwise_not(self: Tensor) -> Tensor:
        """~self, on integer and bool tensors."""
        if self.dtype.is_float:
            raise TypeError(f"bitwise_not is defined on integer and bool tensors, not "
                            f"{self.dtype.name}; cast with .int() first")
        return ~self


def _cos(x: Tensor, s: Tensor) -> Tensor:
    """cos x from s = sin x and the sine of 2x, an exact scaling of x: the device's SIN reduces
    the argument. sin(pi/2 - x) lost everything once pi/2 - x rounded (cos(1e8) gave -0.93 for
    -0.36). Where |sin x| > 1/2, cos is sin 2x / (2 sin x), relatively exact near its zeros;
    elsewhere +-sqrt(1 - s^2), with the sign of sin 2x / sin x."""
    # past half the largest float 2x overflows: there h = sin(x / 2) serves instead, as
    # 1 - 2h^2 where |sin x| > 1/2 (the square root lost 2e-4 near the zeros) and for the sign
    huge = x.abs() > x.dtype.max / 2
    other = huge._where(x * 0.5, x * 2).sin()
    steep = s.abs() > 0.5
    ratio = huge._where(1 - 2 * other * other, other / steep._where(s * 2, 1.0))
    flat = (1 - s * s).sqrt()
    negative = huge._where(other * other * 2 > 1, s * other < 0)
    return steep._where(ratio, negative._where(-flat, flat))


def _number(value: Tensor | Scalar | np.ndarray | np.generic) -> Scalar | None:
    """value as a Python number if it is one (or a numpy scalar or 0-d array), else None."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        value = value.item()
    return value if isinstance(value, int | float) else None


def _in_opmath(x: Tensor, other: Tensor | Scalar) -> bool:
    """A 16-bit float tensor times or over a number (not bool): torch computes these in
    float32 with the number unrounded (its "opmath") and rounds once, where a 16-bit operation
    would round the number first (add and sub do: there torch rounds it too)."""
    if x.dtype.name not in _HALF_NAMES:     # first: most products are of other dtypes
        return False
    number = _number(other)
    return number is not None and not isinstance(number, bool)


def _as_bool(like: Tensor, value: Tensor | Scalar) -> Tensor | bool:
    return value.cast(bool_) if isinstance(value, type(like)) else bool(value)


def _check_int_divisor(x: Tensor, other: Tensor | Scalar, reverse: bool) -> None:
    """Integer division by a zero known on the host raises, as PyTorch's does."""
    divisor, dividend = (x, other) if reverse else (other, x)
    if isinstance(dividend, float) or (isinstance(dividend, type(x))
                                       and dividend.dtype.is_float):
        return
    if isinstance(divisor, type(x)):
        # read back only values the host already holds (a realized buffer), never a graph
        zero = (not divisor.dtype.is_float and divisor.lazy.realized and divisor.numel()
                and (divisor.numpy() == 0).any())
    else:
        zero = isinstance(divisor, int) and divisor == 0
    if zero:
        raise ZeroDivisionError("integer division or modulo by zero; cast to a float dtype "
                                "for inf/NaN results")
