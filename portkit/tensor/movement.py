"""Movement: reshape, permute, expand, pad, shrink, flip and what is built from them.

The graph keeps these as views: they move no data until a kernel reads through them. Indexing
is in indexing.py.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from portkit.tensor.dtype import Scalar, bool_
from portkit.tensor.shapes import (
    AxisLike,
    ShapeError,
    ShapeLike,
    accepts_dim,
    as_axes,
    as_dim,
    as_shape,
    inferred_shape,
)

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

# numpy's ((before, after), ...) from the first dim, or torch's flat (before, after, ...) from
# the last dim
Padding = Sequence[int] | Sequence[tuple[int, int]]


class MovementOps:
    """Tensor's movement ops: new shapes and views of the same elements."""

    __slots__ = ()

    def reshape(self: Tensor, *shape: ShapeLike) -> Tensor:
        """The same elements in row-major order with a new shape (one dim may be -1)."""
        shape = as_shape(shape)
        if shape == self.lazy.shape:
            return self
        shape = inferred_shape(shape, self.numel())
        return self if shape == self.shape else self._prim("reshape", arg=shape)

    view = reshape

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Dims start_dim..end_dim (inclusive) merged into one."""
        start, end = as_dim(start_dim, self.ndim), as_dim(end_dim, self.ndim)
        if self.ndim == 0:
            return self.reshape(1)
        if start > end:
            raise RuntimeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        return self.reshape(self.shape[:start] + (-1,) + self.shape[end + 1:]) \
            if self.numel() else self.reshape(
                self.shape[:start] + (math.prod(self.shape[start:end + 1]),) +
                self.shape[end + 1:])

    def squeeze(self: Tensor, dim: int | None = None) -> Tensor:
        """Size-1 dims removed (only `dim`, if given and of size 1)."""
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dim = as_axes(dim, self.ndim)[0] if self.ndim else 0
        if not self.ndim or self.shape[dim] != 1:
            return self
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        """A size-1 dim inserted at `dim`."""
        dim = as_dim(dim, self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def permute(self: Tensor, *order: ShapeLike) -> Tensor:
        """The dims reordered: dim i of the result is dim order[i] of self."""
        ndim = len(self.lazy.shape)
        order = as_shape(order)
        if order and (min(order) < 0 or max(order) >= ndim):
            order = tuple(as_dim(o, ndim) for o in order)
        if sorted(order) != list(range(ndim)):
            raise ValueError(f"permute order {order} is not a permutation of "
                             f"{self.ndim} dimensions")
        return self if order == tuple(range(self.ndim)) else self._prim("permute", arg=order)

    def transpose(self: Tensor, dim0: int = -2, dim1: int = -1) -> Tensor:
        """Two dims swapped."""
        order = list(range(self.ndim))
        order[dim0], order[dim1] = order[dim1], order[dim0]
        return self.permute(order)

    @property
    def T(self: Tensor) -> Tensor:
        """All dims reversed."""
        return self.permute(tuple(reversed(range(self.ndim))))

    def expand(self: Tensor, *shape: ShapeLike) -> Tensor:
        """Size-1 dims repeated (without copying) to `shape`; -1 keeps a dim."""
        shape = as_shape(shape)
        if shape == self.lazy.shape:
            return self
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ShapeError(f"expand {self.shape} to {shape}: give at least one size per "
                             f"dimension ({self.ndim}), new dimensions first")
        for index, size in enumerate(shape):
            if size < -1 or size == -1 and index < lead:
                raise ShapeError(f"expand {self.shape} to {shape}: size {size} at index {index} "
                                 "is not allowed; sizes are >= 0, or -1 to keep an existing "
                                 "dimension")
        new = tuple(s if s != -1 else o for s, o in zip(shape, (None,) * lead + self.shape))
        x = self.reshape((1,) * (len(new) - self.ndim) + self.shape)
        for old, want in zip(x.shape, new):
            if old != want and old != 1:
                raise ShapeError(f"cannot expand shape {self.shape} to {new}: only size-1 dims grow")
        return x if x.shape == new else x._prim("expand", arg=new)

    def expand_as(self: Tensor, other: Tensor) -> Tensor:
        """expand() to other's shape."""
        return self.expand(other.shape)

    def pad(self: Tensor, padding: Padding, value: Scalar = 0) -> Tensor:
        """padding: ((before, after), ...) from the first dim (numpy), or flat (before, after,
        ...) from the last dim (torch.nn.functional.pad); negative values crop."""
        if all(isinstance(p, int) for p in padding):
            if len(padding) % 2 or len(padding) > 2 * self.ndim:
                raise ValueError(f"pad: flat padding {tuple(padding)} needs an even length up "
                                 f"to {2 * self.ndim} for shape {self.shape}")
            pairs = [(padding[k], padding[k + 1]) for k in range(0, len(padding), 2)]
            padding = [(0, 0)] * (self.ndim - len(pairs)) + pairs[::-1]
        padding = tuple((int(a), int(b)) for a, b in padding)
        padding += ((0, 0),) * (self.ndim - len(padding))
        if any(a < 0 or b < 0 for a, b in padding):
            crop = tuple((max(-a, 0), s - max(-b, 0)) for (a, b), s in zip(padding, self.shape))
            return self.shrink(crop).pad(tuple((max(a, 0), max(b, 0)) for a, b in padding),
                                         value)
        if all(p == (0, 0) for p in padding):
            return self
        out = self._prim("pad", arg=padding)
        if value == 0:
            return out
        inside = type(self).ones(*self.shape, dtype=bool_, device=self.device)._prim(
            "pad", arg=padding)
        return inside._where(out, value)

    def shrink(self: Tensor, arg: Sequence[tuple[int, int] | None]) -> Tensor:
        """The (begin, end) range of each dim (None keeps a dim whole)."""
        arg = tuple((0, s) if a is None else (int(a[0]), int(a[1]))
                    for a, s in zip(arg, self.shape))
        for (b, e), s in zip(arg, self.shape):
            if not 0 <= b <= e <= s:
                raise IndexError(f"shrink {arg} is outside shape {self.shape}")
        if all(a == (0, s) for a, s in zip(arg, self.shape)):
            return self
        return self._prim("shrink", arg=arg)

    @accepts_dim
    def flip(self: Tensor, axis: AxisLike) -> Tensor:
        """The order of elements reversed along `axis` (None: every axis)."""
        axes = as_axes(axis, self.ndim)
        return self._prim("flip", arg=axes) if axes else self

    def repeat(self: Tensor, *repeats: ShapeLike) -> Tensor:
        """The tensor tiled repeats[i] times along dim i, as torch.Tensor.repeat."""
        repeats = as_shape(repeats)
        if len(repeats) < self.ndim or any(r < 0 for r in repeats):
            raise ShapeError(f"repeat {self.shape} by {repeats}: give one count >= 0 per "
                             f"dimension ({self.ndim}), new dimensions first")
        x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
        expanded = x.reshape(tuple(d for s in x.shape for d in (1, s))).expand(
            tuple(d for r, s in zip(repeats, x.shape) for d in (r, s)))
        return expanded.reshape(tuple(r * s for r, s in zip(repeats, x.shape)))

    def unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
        """Windows of `size` elements every `step` along `dimension`, as a new last dim (its
        place holds the window count), as torch.Tensor.unfold."""
        dim = as_dim(dimension, self.ndim)
        n = self.shape[dim] if self.ndim else 1
        if not 0 <= size <= n or step < 1:
            raise RuntimeError(f"unfold: size {size} must be in [0, {n}] (the size of dim "
                               f"{dim}) and step {step} >= 1")
        count = (n - size) // step + 1
        start = type(self).arange(0, count * step, step, device=self.device).reshape(count, 1)
        index = start + type(self).arange(size, device=self.device).reshape(1, size)
        if not self.ndim:
            return self.reshape(1).index_select(0, index).reshape(size)
        # index_select puts (count, size) where dim was; the window's dim goes last
        out = self.index_select(dim, index)
        return out.permute([d for d in range(out.ndim) if d != dim + 1] + [dim + 1])

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        """Dim `dim` split into dims of `sizes` (one may be -1), as torch.unflatten."""
        dim = as_dim(dim, self.ndim)
        return self.reshape(self.shape[:dim] + tuple(sizes) + self.shape[dim + 1:])

    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> list[Tensor]:
        """Pieces along `dim`: of the given sizes, or all of size `sizes` but the last."""
        dim = as_dim(dim, self.ndim)
        n = self.shape[dim]
        if isinstance(sizes, int) and sizes <= 0 and n:
            raise RuntimeError(f"split: split_size must be positive, got {sizes}")
        if isinstance(sizes, int):
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] if n else [0]
        if sum(sizes) != n:
            raise ValueError(f"split sizes {list(sizes)} do not add up to {n}")
        out, start = [], 0
        for size in sizes:
            arg = [(0, s) for s in self.shape]
            arg[dim] = (start, start + size)
            out.append(self.shrink(arg))
            start += size
        return out

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
        """At most `chunks` pieces of equal size (the last may be smaller) along `dim`."""
        if chunks <= 0:
            raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got {chunks}")
        n = self.shape[as_dim(dim, self.ndim)]
        return self.split(max(1, math.ceil(n / chunks)), dim)

    def cat(self: Tensor, *others: Tensor, dim: int = 0) -> Tensor:
        """self and others joined along `dim`."""
        return cat([self, *others], dim)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Joins tensors along `dim`: each is padded to the full size and they are summed."""
    if not tensors:
        raise ValueError("cat needs at least one tensor")
    first = tensors[0]
    dim = as_dim(dim, first.ndim)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(
                zip(t.shape, first.shape)) if i != dim):
            raise ValueError(f"cat: shapes {first.shape} and {t.shape} differ outside dim "
                             f"{dim}")
    total = sum(t.shape[dim] for t in tensors)
    pieces, start = [], 0
    for t in tensors:
        padding = [(0, 0)] * t.ndim
        padding[dim] = (start, total - start - t.shape[dim])
        pieces.append(t.pad(padding))
        start += t.shape[dim]
    return _join(pieces)


def _join(pieces: Sequence[Tensor]) -> Tensor:
    """The padded pieces of a cat summed as a balanced tree, so that a join too wide for one
    kernel's buffers splits at its sources (schedule/fusion.py) in a few rounds into a few
    kernels: as a chain, an LSTM's output (200 steps, 64 buffers) split into 138 kernels, each
    compiled and each writing the whole output."""
    if len(pieces) == 1:
        return pieces[0]
    half = (len(pieces) + 1) // 2
    left, right = _join(pieces[:half]), _join(pieces[half:])
    # the pieces never overlap, so or-ing joins bools (which have no ADD)
    return left + right if left.dtype != bool_ else left | right


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Joins same-shaped tensors along a new dimension."""
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    dim = as_dim(dim, tensors[0].ndim + 1)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def meshgrid(*tensors: Tensor, indexing: str = "ij") -> list[Tensor]:
    """Coordinate grids of 1-d tensors, as views: "ij" (matrix) or "xy" (Cartesian) indexing."""
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    if len(tensors) == 1 and isinstance(tensors[0], list | tuple):
        tensors = tuple(tensors[0])
    if any(t.ndim != 1 for t in tensors):
        raise RuntimeError("meshgrid takes 1-d tensors")
    sizes = [t.shape[0] for t in tensors]
    order = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) >= 2:
        order[0], order[1] = 1, 0            # Cartesian: the first input varies along columns
    shape = tuple(sizes[i] for i in order)
    out = []
    for k, t in enumerate(tensors):
        view = [1] * len(tensors)
        view[order.index(k)] = sizes[k]
        out.append(t.reshape(tuple(view)).expand(shape))
    return out


def einsum(equation: str, *operands: Tensor) -> Tensor:
    """Einstein summation over letters without repeats within an operand and without "...":
    each operand is aligned to every letter, multiplied, and summed over the letters not in
    the output (e.g. "ij,jk->ik", "bij,bjk->bik", "i,i->", "ij->ji")."""
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    equation = equation.replace(" ", "")
    inputs, _, output = equation.partition("->")
    terms = inputs.split(",")
    if "." in equation or len(terms) != len(operands):
        raise NotImplementedError(f"einsum {equation!r}: one term per operand, without '...'")
    if "->" not in equation:      # the implicit output: letters seen once, alphabetical
        output = "".join(sorted(c for c in set(inputs) - {","} if inputs.count(c) == 1))
    letters = list(dict.fromkeys(output + inputs.replace(",", "")))
    sizes: dict[str, int] = {}
    product = None
    for term, t in zip(terms, operands):
        if len(term) != t.ndim or len(set(term)) != len(term):
            raise NotImplementedError(f"einsum term {term!r} for shape {t.shape}: one distinct "
                                      "letter per dim (no diagonals)")
        for c, s in zip(term, t.shape):
            if sizes.setdefault(c, s) != s and 1 not in (s, sizes[c]):
                raise RuntimeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s}")
            sizes[c] = max(sizes[c], s)
        aligned = t.permute([term.index(c) for c in letters if c in term])
        aligned = aligned.reshape(tuple(t.shape[term.index(c)] if c in term else 1
                                        for c in letters))
        product = aligned if product is None else product * aligned
    summed = tuple(range(len(output), len(letters)))
    return product.sum(summed) if summed else product
