"""torch.nn.functional's activations that are a line over Tensor methods: relu, sigmoid, tanh,
softmax and its kin, threshold, the shrinks and glu (the others are in functional.py).

`inplace=` is accepted where torch has it and changes nothing: the result is a new tensor and
the input keeps its values (write `x = F.relu(x, inplace=True)`, as models do).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from portkit.tensor.dtype import DTypeLike

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(x, 0); NaN stays NaN."""
    return input.relu()


def sigmoid(input: Tensor) -> Tensor:
    """1 / (1 + exp(-x))."""
    return input.sigmoid()


def tanh(input: Tensor) -> Tensor:
    """The hyperbolic tangent."""
    return input.tanh()


def softmax_dim(input: Tensor, dim: int | None) -> int:
    """dim, or torch's legacy choice without one: 0 for 0-, 1- and 3-d input, else 1."""
    return dim if dim is not None else 0 if input.ndim in (0, 1, 3) else 1


def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
            dtype: DTypeLike | None = None) -> Tensor:
    """exp(x) / sum(exp(x)) over dim, of input cast to dtype first when given."""
    x = input if dtype is None else input.cast(dtype)
    return x.softmax(softmax_dim(input, dim))


def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
                dtype: DTypeLike | None = None) -> Tensor:
    """log(softmax(x)) over dim, without the intermediate exp."""
    x = input if dtype is None else input.cast(dtype)
    return x.log_softmax(softmax_dim(input, dim))


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3,
            dtype: DTypeLike | None = None) -> Tensor:
    """softmax(-x) over dim."""
    return softmax(-input, softmax_dim(input, dim), dtype=dtype)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, else value (NaN stays NaN)."""
    return (input <= threshold)._where(value, input)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x where |x| > lambd, else 0 (NaN stays NaN)."""
    return ((input >= -lambd) & (input <= lambd))._where(0, input)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x - lambd above lambd, x + lambd below -lambd, else 0 (NaN stays NaN)."""
    if not lambd >= 0:
        raise RuntimeError(f"softshrink: lambda must be >= 0, but found {lambd}")
    inside = (input > lambd)._where(input - lambd, input + lambd)
    return ((input >= -lambd) & (input <= lambd))._where(0, inside)


def tanhshrink(input: Tensor) -> Tensor:
    """x - tanh(x)."""
    return input - input.tanh()


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b), where a and b are the two halves of input along dim."""
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    if input.shape[dim] % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {dim} is size "
                           f"{input.shape[dim]}")
    a, b = input.chunk(2, dim)
    return a * b.sigmoid()


__all__ = ["glu", "hardshrink", "log_softmax", "relu", "sigmoid", "softmax", "softmax_dim",
           "softmin", "softshrink", "tanh", "tanhshrink", "threshold"]
