"""Views: how a tensor's elements sit in a flat buffer, so movement ops copy nothing.

A `View` is shape, strides, an offset and an optional mask (the region that holds real data;
outside it reads as zero, which is how `pad` costs nothing). Movement ops compose into the last
view; a reshape that strides cannot express pushes a new view, and a `ShapeTracker` chains them.
`ShapeTracker.index` turns a multi-index into a flat index plus validity conditions, as symbolic
expressions (portkit/symbolic.py) that codegen lowers.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from portkit.symbolic import Bound, Lin, const, recombine, unravel

Shape = tuple[int, ...]


def strides_for(shape: Shape) -> tuple[int, ...]:
    """Row-major strides, 0 for size-1 dimensions."""
    out, stride = [], 1
    for size in reversed(shape):
        out.append(stride if size != 1 else 0)
        stride *= size
    return tuple(reversed(out))


# strides_for of the shapes views test for contiguity, which recur at every op of a step
_row_major = lru_cache(maxsize=4096)(strides_for)


class View(NamedTuple):
    """shape, strides and offset into a flat buffer; mask = per-dim [lo, hi) of real data.

    A named tuple rather than a frozen dataclass: graphs carry views in their cache keys, and a
    tuple hashes and compares in C where a dataclass runs Python for every view at every
    look-up (and is slower to make)."""

    shape: Shape
    strides: tuple[int, ...]
    offset: int = 0
    mask: tuple[tuple[int, int], ...] | None = None

    @staticmethod
    @lru_cache(maxsize=4096)
    def contiguous(shape: Shape) -> View:
        return View(tuple(shape), strides_for(shape))

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and self.mask is None and self.strides == _row_major(self.shape)

    def _with(self, shape, strides, offset, mask) -> View:
        shape, strides = tuple(shape), tuple(strides)
        if mask is not None:
            mask = tuple(mask)
            if any(lo >= hi for lo, hi in mask):
                # nothing is real data: any element reads zero
                mask = tuple((0, 0) for _ in shape)
            elif all(lo == 0 and hi == s for (lo, hi), s in zip(mask, shape)):
                mask = None
        if 1 in shape:
            strides = tuple([0 if s == 1 else st for s, st in zip(shape, strides)])
        return View(shape, strides, offset, mask)

    def permute(self, order: tuple[int, ...]) -> View:
        mask = None if self.mask is None else [self.mask[i] for i in order]
        return self._with([self.shape[i] for i in order], [self.strides[i] for i in order],
                          self.offset, mask)

    def expand(self, shape: Shape) -> View:
        mask = None if self.mask is None else [
            m if old == new else ((0, new) if m != (0, 0) else (0, 0))
            for m, old, new in zip(self.mask, self.shape, shape)]
        strides = [st if old == new else 0 for st, old, new in zip(self.strides, self.shape, shape)]
        return self._with(shape, strides, self.offset, mask)

    def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
        """Keeps [begin, end) per dim; begin may be negative and end past the size (see pad)."""
        offset = self.offset + sum(b * st for (b, _), st in zip(arg, self.strides))
        mask = self.mask or tuple((0, s) for s in self.shape)
        mask = [(max(lo, b) - b, min(hi, e) - b) for (lo, hi), (b, e) in zip(mask, arg)]
        shape = [e - b for b, e in arg]
        return self._with(shape, self.strides, offset, mask)

    def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
        return self.shrink(tuple((-lo, s + hi) for (lo, hi), s in zip(arg, self.shape)))

    def flip(self, axes: tuple[int, ...]) -> View:
        offset = self.offset + sum((self.shape[a] - 1) * self.strides[a] for a in axes)
        strides = [-st if i in axes else st for i, st in enumerate(self.strides)]
        mask = None if self.mask is None else [
            (s - hi, s - lo) if i in axes else (lo, hi)
            for i, ((lo, hi), s) in enumerate(zip(self.mask, self.shape))]
        return self._with(self.shape, strides, offset, mask)

    def reshape(self, shape: Shape) -> View | None:
        """The same elements in a new shape, or None when one strided view cannot say it."""
        if self.shape == shape:
            return self
        if 0 in shape or self.is_contiguous:
            return View.contiguous(shape) if self.offset == 0 or 0 in shape else View(
                shape, strides_for(shape), self.offset)
        if self.mask is not None:
            # only inserting or removing size-1 dimensions keeps a mask expressible
            if [s for s in self.shape if s != 1] != [s for s in shape if s != 1]:
                return None
            real = iter([(m, st) for m, st, s in zip(self.mask, self.strides, self.shape)
                         if s != 1])
            dropped_ok = all(m == (0, 1) for m, s in zip(self.mask, self.shape) if s == 1)
            if not dropped_ok:
                return None
            mask, strides = [], []
            for s in shape:
                m, st = next(real) if s != 1 else ((0, 1), 0)
                mask.append(m)
                strides.append(st)
            return self._with(shape, strides, self.offset, mask)
        strides = _nocopy_strides(self.shape, self.strides, shape)
        return None if strides is None else self._with(shape, strides, self.offset, None)

    def index(self, idx: list[Lin]) -> tuple[Lin, list[Bound]]:
        """Flat position of the element at multi-index `idx`, and when it is real data."""
        flat = const(self.offset)
        for i, st in zip(idx, self.strides):
            if st:
                flat = flat + i * st
        conds = [] if self.mask is None else [
            Bound(i, lo, hi) for i, (lo, hi), s in zip(idx, self.mask, self.shape)
            if (lo, hi) != (0, s)]
        return recombine(flat), conds

    def split(self, idx: list[Lin], shape: Shape) -> list[Lin] | None:
        """The multi-index into a row-major `shape` that this view reads at `idx`, axis by axis,
        where each of its axes steps along one axis of `shape` and every real element's position
        stays inside that axis (a pad, shrink, flip, expand or permute of `shape`); else None.

        Unravelling the flat index gives the same positions, but a pad's negative offset keeps
        the simplifier from folding its divs and mods (`(56*h + w + 3079) // 3136` per element,
        where the source's channel is simply c)."""
        found = self.placement(shape)
        if found is None:
            return None
        moves, shifts = found
        terms: list[list[tuple[Lin, int]]] = [[] for _ in shape]
        for i, move in zip(idx, moves):
            if move is not None:
                terms[move[0]].append((i, move[1]))
        return [recombine(sum((i * step for i, step in parts), const(shift)))
                for parts, shift in zip(terms, shifts)]

    def placement(self, shape: Shape) -> tuple[list[tuple[int, int] | None], list[int]] | None:
        """How `split` reads `shape`: the axis of `shape` each axis of this view steps along and
        by how much (None: it does not move), and the offset's shift along each axis of
        `shape`; None where `split` gives None."""
        rows = _rows(shape)
        mask = self.mask or tuple((0, s) for s in self.shape)
        moves: list[tuple[int, int] | None] = []
        low, high = [0] * len(shape), [0] * len(shape)   # the terms' range per source axis
        for size, st, (lo, hi) in zip(self.shape, self.strides, mask):
            if st == 0 or size == 1:
                moves.append(None)
                continue
            axis = next((j for j in range(len(shape)) if shape[j] > 1 and rows[j] <= abs(st)
                         and st % rows[j] == 0), None)
            if axis is None:
                return None
            step = st // rows[axis]
            moves.append((axis, step))
            low[axis] += min(step * lo, step * (hi - 1))
            high[axis] += max(step * lo, step * (hi - 1))
        # the offset, split into one shift per source axis (innermost first) that keeps each
        # axis's positions in [0, size); there is at most one such split
        shifts, rest = [0] * len(shape), self.offset
        for j in range(len(shape) - 1, -1, -1):
            first, last = -low[j], shape[j] - 1 - high[j]
            if first > last or rest % rows[j]:
                return None
            units = rest // rows[j]
            shift = units if j == 0 else first + (units - first) % shape[j]
            if not first <= shift <= last:
                return None
            shifts[j], rest = shift, rest - shift * rows[j]
        return moves, shifts

    def free(self, shape: Shape) -> tuple[tuple[int, ...], int] | None:
        """The axes of `shape` (longer than 1) that no axis of this view steps along, where
        `split` reads `shape`, and the offset less its part along them (x[:, t] of an
        (n, steps, k) `shape`: axis 1, and 0 at every t); else None. The offset's part along
        them may be any position on them: this view's shape and strides, and the offset's
        other part, do not decide it."""
        found = self.placement(shape)
        if found is None:
            return None
        moves, shifts = found
        stepped = {move[0] for move in moves if move is not None}
        axes = tuple(j for j, size in enumerate(shape) if size > 1 and j not in stepped)
        rows = _rows(shape)
        return (axes, self.offset - sum(shifts[j] * rows[j] for j in axes)) if axes else None


def _rows(shape: Shape) -> list[int]:
    """Row-major strides, size-1 dimensions included."""
    rows = [1] * len(shape)
    for j in range(len(shape) - 2, -1, -1):
        rows[j] = rows[j + 1] * shape[j + 1]
    return rows


def _nocopy_strides(old: Shape, old_strides: tuple[int, ...], new: Shape) -> list[int] | None:
    """Strides that give `new` the same elements as (old, old_strides), or None.

    Walks the new dims left to right: a new dim either splits the outer part of the next old
    dim or merges whole old dims whose strides chain (stride[k] == size[k+1] * stride[k+1]).
    """
    queue = [(s, st) for s, st in zip(old, old_strides) if s != 1]
    out: list[int] = []
    for size in (s for s in new if s != 1):
        if not queue:
            return None
        s, st = queue[0]
        if s % size == 0:
            out.append(st * (s // size))
            queue[0] = (s // size, st)
            if queue[0][0] == 1:
                queue.pop(0)
            continue
        product, stride = 1, None
        while product < size and queue:
            s, st = queue.pop(0)
            if stride is not None and stride != s * st:
                return None
            stride, product = st, product * s
        if product != size:
            return None
        out.append(stride)
    if queue:
        return None
    real = iter(out)
    return [next(real) if s != 1 else 0 for s in new]


class ShapeTracker(NamedTuple):
    """A chain of views; the last one is what the user sees, the first one reads the buffer."""

    views: tuple[View, ...]

    @staticmethod
    @lru_cache(maxsize=4096)
    def contiguous(shape: Shape) -> ShapeTracker:
        return ShapeTracker((View.contiguous(tuple(shape)),))

    @property
    def shape(self) -> Shape:
        return self.views[-1].shape

    @property
    def is_contiguous(self) -> bool:
        return len(self.views) == 1 and self.views[0].is_contiguous

    def _last(self, view: View) -> ShapeTracker:
        return ShapeTracker(self.views[:-1] + (view,))

    def permute(self, order: tuple[int, ...]) -> ShapeTracker:
        return self._last(self.views[-1].permute(order))

    def expand(self, shape: Shape) -> ShapeTracker:
        return self._last(self.views[-1].expand(shape))

    def shrink(self, arg: tuple[tuple[int, int], ...]) -> ShapeTracker:
        return self._last(self.views[-1].shrink(arg))

    def pad(self, arg: tuple[tuple[int, int], ...]) -> ShapeTracker:
        return self._last(self.views[-1].pad(arg))

    def flip(self, axes: tuple[int, ...]) -> ShapeTracker:
        return self._last(self.views[-1].flip(axes))

    def reshape(self, shape: Shape) -> ShapeTracker:
        view = self.views[-1].reshape(tuple(shape))
        if view is not None:
            return self._last(view)
        return ShapeTracker(self.views + (View.contiguous(tuple(shape)),))

    def index(self, idx: list[Lin]) -> tuple[Lin, list[Bound]]:
        """Flat index into the base buffer for multi-index `idx`, and its validity conditions."""
        flat, conds = self.views[-1].index(idx)
        for view in reversed(self.views[:-1]):
            flat, more = view.index(unravel(flat, view.shape))
            conds += more
        return flat, conds
