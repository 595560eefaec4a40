"""Powers of float tensors: x ** number by the special cases of PyTorch's CPU kernel, which its
gradient x ** (number - 1) takes too, and x ** y of two tensors through EXP2 and LOG2."""
from __future__ import annotations

from typing import TYPE_CHECKING

from portkit.tensor.dtype import Scalar

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# integral exponents up to this magnitude multiply (x ** -3 is 1 / (x * x * x))
MULTIPLIED = 8


def scalar_pow(x: Tensor, exponent: Scalar) -> Tensor:
    """x ** exponent as torch computes it on the CPU, where it differs from C's pow at -0 and
    -inf: 1 at 0, sqrt at 0.5 and 1 / sqrt at -0.5 ((-0) ** -0.5 is -inf, (-inf) ** 0.5 NaN),
    products and a reciprocal for integral exponents (torch's float16 CPU kernel alone takes
    C's pow at +-0.5). x is a float tensor, or an integer one with an integral exponent of at
    most MULTIPLIED."""
    if exponent == 0:
        return x.ones_like()
    if abs(exponent) == 0.5:
        root = x.sqrt()
        return root if exponent > 0 else root.reciprocal()
    # compared, not converted with int(): portkit.jit guards comparisons of the numbers it
    # replays, so a replay whose exponent takes another count of products is refused
    count = next((n for n in range(1, MULTIPLIED + 1) if abs(exponent) == n), None)
    if count is not None:
        out = x
        for _ in range(count - 1):
            out = out * x
        return out.reciprocal() if exponent < 0 else out
    return real_pow(*x._operand(exponent))


def real_pow(x: Tensor, y: Tensor) -> Tensor:
    """x ** y of two float tensors of one shape (C's pow): exp2(y * log2|x|) with the sign of
    an odd integer power, -0 included; NaN for a negative base to a fractional power, but -inf's
    (inf or 0); 1 for x ** 0 and 1 ** y, NaN and infinities included (where y * log2|x| is
    0 * inf)."""
    magnitude = (y * x.abs().log2()).exp2()
    odd = (y.abs() % 2) == 1
    sign_bit = x.bitcast(f"int{x.dtype.bits}") < 0        # x < 0 misses -0: (-0) ** -1 is -inf
    signed = (sign_bit & odd)._where(-magnitude, magnitude)
    fractional = (x < 0) & (y.trunc() != y) & (x != float("-inf"))
    return ((y == 0) | (x == 1))._where(1.0, fractional._where(float("nan"), signed))
