"""Shape and axis arguments as the Tensor API accepts them, made into tuples of ints."""
from __future__ import annotations

from collections.abc import Sequence

ShapeLike = int | Sequence[int]
AxisLike = int | Sequence[int] | None


def as_shape(shape: Sequence[ShapeLike]) -> tuple[int, ...]:
    """A shape given as varargs (2, 3) or as one sequence ((2, 3),), as a tuple of ints."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = shape[0]
    return tuple(int(s) for s in shape)


def as_axes(axis: AxisLike, ndim: int) -> tuple[int, ...]:
    """Sorted non-negative axes of an ndim-dimensional tensor; None means all of them."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -max(ndim, 1) <= a < max(ndim, 1):
            raise IndexError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted({a % ndim for a in axes})) if ndim else ()
