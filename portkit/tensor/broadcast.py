"""Operands of elementwise ops: broadcasting two tensors to one shape, and Python ints wrapped
into an integer dtype's range, as PyTorch treats them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from portkit.tensor.dtype import Scalar

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


def wrapped(value: Scalar, dtype) -> Scalar:
    """A Python int taken modulo an integer dtype's range, as PyTorch does with scalars."""
    if type(value) is float or not dtype.is_int or isinstance(value, bool) or not isinstance(
            value, int):
        return value
    span = 1 << dtype.bits
    value %= span
    # dtype.max without numpy's iinfo, which is made anew at every call
    largest = span - 1 if dtype.kind == "uint" else (span >> 1) - 1
    return value - span if value > largest else value


def broadcast(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """a and b as views of one shape, by numpy's rules (ValueError if they have none)."""
    if a.shape == b.shape:
        return a, b
    ndim = max(a.ndim, b.ndim)
    sa, sb = (1,) * (ndim - a.ndim) + a.shape, (1,) * (ndim - b.ndim) + b.shape
    out = []
    for x, y in zip(sa, sb):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {a.shape} and {b.shape} cannot be broadcast together")
        out.append(y if x == 1 else x)
    out = tuple(out)
    return expanded(a, sa, out), expanded(b, sb, out)


def expanded(x: Tensor, shape: tuple[int, ...], out: tuple[int, ...]) -> Tensor:
    """x.reshape(shape).expand(out), for shapes `broadcast` checked, without checking again."""
    x = x if shape == x.shape else x._prim("reshape", arg=shape)
    return x if out == shape else x._prim("expand", arg=out)
