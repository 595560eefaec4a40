"""Shape and axis arguments as the Tensor API accepts them, made into tuples of ints."""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence

from portkit.abi.errors import PortkitError
from portkit.graph import check_elements

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


class ShapeError(PortkitError, RuntimeError, ValueError):
    """A shape argument that does not fit the tensor (a size below -1, an ambiguous -1, a wrong
    element count): a RuntimeError, as PyTorch raises, and a ValueError, as for any bad
    argument."""


def inferred_shape(shape: tuple[int, ...], numel: int) -> tuple[int, ...]:
    """`shape` for `numel` elements, its one -1 (if any) replaced by the size that fits, with
    PyTorch's checks: ShapeError for a size below -1, two -1, a -1 beside a 0, a wrong count."""
    for index, size in enumerate(shape):
        if size < -1:
            raise ShapeError(f"invalid shape dimension {size} at index {index} of shape "
                             f"{list(shape)}: sizes are >= 0, or -1 for the one to infer")
    if shape.count(-1) > 1:
        raise ShapeError(f"shape {list(shape)}: only one dimension can be inferred (-1)")
    if -1 in shape:
        rest = math.prod(s for s in shape if s != -1)
        if rest == 0 and numel == 0:
            raise ShapeError(f"cannot reshape a tensor of 0 elements into shape {list(shape)}: "
                             "the -1 could be any size, so it is ambiguous; give every size")
        if rest and numel % rest == 0:
            shape = tuple(numel // rest if s == -1 else s for s in shape)
    if -1 in shape or math.prod(shape) != numel:
        raise ShapeError(f"shape {list(shape)} is invalid for a tensor of {numel} elements")
    return shape


def as_sizes(shape: Sequence[ShapeLike]) -> tuple[int, ...]:
    """as_shape() of a new tensor's shape, whose sizes may not be negative and whose elements
    kernels can index (graph.TooLarge past 2^31 - 1)."""
    sizes = as_shape(shape)
    if any(s < 0 for s in sizes):
        raise RuntimeError(f"cannot create a tensor with a negative dimension: {sizes}")
    check_elements(sizes)
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
