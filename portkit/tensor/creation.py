"""Tensors made from nothing but a shape: constants, ranges, the identity, and the `_like` forms.

Random tensors are in random.py; tensors from data (lists, numpy arrays) are Tensor(...) itself.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from portkit import graph, runtime
from portkit.tensor.dtype import (
    DTypeLike,
    Scalar,
    check_dtype,
    default_float,
    int32,
    scalar_dtype,
    to_dtype,
)
from portkit.tensor.shapes import ShapeLike, as_sizes

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


class CreationOps:
    """Tensor's constructors: full, zeros, ones, arange, linspace, eye and their `_like` forms."""

    __slots__ = ()

    @classmethod
    def full(cls: type[Tensor], shape: Sequence[int], value: Scalar, dtype: DTypeLike | None = None,
             device: str | None = None) -> Tensor:
        """A tensor of `shape` with every element `value` (a constant: no buffer, no kernel)."""
        shape = as_sizes(shape)
        device = runtime.device_name(device)
        dtype = check_dtype(to_dtype(dtype) or scalar_dtype(value), device)
        return cls(graph.const(value, dtype, shape, device))

    @classmethod
    def zeros(cls: type[Tensor], *shape: ShapeLike, dtype: DTypeLike | None = None,
              device: str | None = None) -> Tensor:
        """Zeros (default_float unless dtype says otherwise)."""
        return cls.full(shape, 0.0, dtype or default_float, device)

    @classmethod
    def ones(cls: type[Tensor], *shape: ShapeLike, dtype: DTypeLike | None = None,
             device: str | None = None) -> Tensor:
        """Ones (default_float unless dtype says otherwise)."""
        return cls.full(shape, 1.0, dtype or default_float, device)

    @classmethod
    def arange(cls: type[Tensor], start: Scalar, stop: Scalar | None = None, step: Scalar = 1,
               dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        """start, start + step, ... below stop (int32 when all three are ints)."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise RuntimeError("arange: step must be nonzero")
        dtype = to_dtype(dtype) or (int32 if all(isinstance(v, int) for v in (start, stop, step))
                                    else default_float)
        count = max(0, math.ceil((stop - start) / step))
        if dtype.is_int and count and not (dtype.min <= start <= dtype.max and
                                           dtype.min <= start + (count - 1) * step <= dtype.max):
            raise OverflowError(f"arange({start}, {stop}, {step}) does not fit {dtype.name}; "
                                f"pass dtype=portkit.int64 on a device that has it")
        index = cls(graph.iota((count,), 0, runtime.device_name(device)))
        return (index.cast(dtype) * step + start).cast(dtype)

    @classmethod
    def linspace(cls: type[Tensor], start: float, stop: float, steps: int, dtype: DTypeLike | None = None,
                 device: str | None = None) -> Tensor:
        """`steps` evenly spaced values from start to stop, both included."""
        if steps < 0:
            raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
        index = cls(graph.iota((steps,), 0, runtime.device_name(device)))
        step = (stop - start) / (steps - 1) if steps > 1 else 0.0
        return (index.cast(default_float) * step + start).cast(to_dtype(dtype) or default_float)

    @classmethod
    def eye(cls: type[Tensor], n: int, m: int | None = None, dtype: DTypeLike | None = None,
            device: str | None = None) -> Tensor:
        """An n x m (default n x n) matrix with ones on the diagonal."""
        device = runtime.device_name(device)
        if n < 0 or (m is not None and m < 0):
            raise RuntimeError(f"eye: sizes must be >= 0, got n={n}, m={m}")
        rows = cls(graph.iota((n, m or n), 0, device))
        cols = cls(graph.iota((n, m or n), 1, device))
        return (rows == cols).cast(to_dtype(dtype) or default_float)

    def full_like(self: Tensor, value: Scalar, dtype: DTypeLike | None = None) -> Tensor:
        """full() with this tensor's shape, device and (unless given) dtype."""
        return type(self).full(self.shape, value, dtype or self.dtype, self.device)

    def zeros_like(self: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        """Zeros with this tensor's shape, device and (unless given) dtype."""
        return self.full_like(0, dtype)

    def ones_like(self: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        """Ones with this tensor's shape, device and (unless given) dtype."""
        return self.full_like(1, dtype)
