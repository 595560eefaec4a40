"""Shape and axis arguments as the Tensor API accepts them, made into tuples of ints."""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence

ShapeLike = int | Sequence[int]
AxisLike = int | Sequence[int] | None


def as_shape(shape: Sequence[ShapeLike]) -> tuple[int, ...]:
    """A shape given as varargs (2, 3) or as one sequence ((2, 3),), as a tuple of ints."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = shape[0]
    try:
        return tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"sizes must be integers, got {tuple(shape)}; round them with int() "
                        "first") from None


def as_sizes(shape: Sequence[ShapeLike]) -> tuple[int, ...]:
    """as_shape() of a new tensor's shape, whose sizes may not be negative."""
    sizes = as_shape(shape)
    if any(s < 0 for s in sizes):
        raise RuntimeError(f"cannot create a tensor with a negative dimension: {sizes}")
    return sizes


def as_dim(dim: int, ndim: int) -> int:
    """A non-negative dim of an ndim-dimensional tensor (IndexError, as PyTorch, if outside)."""
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise IndexError(f"dimension out of range (expected to be in range of "
                         f"[{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {dim})")
    return dim % max(ndim, 1)


def as_axes(axis: AxisLike, ndim: int) -> tuple[int, ...]:
    """Sorted non-negative axes of an ndim-dimensional tensor; None means all of them."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise IndexError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted({a % ndim for a in axes})) if ndim else ()


def accepts_dim(method: Callable) -> Callable:
    """Lets a method that takes `axis` also take PyTorch's name for it, `dim`."""
    @functools.wraps(method)
    def wrapper(self, *args, dim=None, **kwargs):
        if dim is not None:
            if args or "axis" in kwargs:
                raise TypeError(f"{method.__name__}() got both axis and dim; pass one")
            kwargs["axis"] = dim
        return method(self, *args, **kwargs)
    return wrapper
