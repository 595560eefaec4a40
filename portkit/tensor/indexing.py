"""Indexing: numpy's basic and advanced indexing (`t[...]`), index_select and gather.

Basic indexing is movement (shrink, flip, strides by pad and reshape); integer-tensor indices
become a one-hot comparison summed over the indexed dim, which every device can run.
"""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from portkit.tensor import core
from portkit.tensor.dtype import bool_, int32
from portkit.tensor.shapes import as_axes

if TYPE_CHECKING:
    from types import EllipsisType

    from portkit.tensor.core import Tensor

    # per dim, as numpy: an int, a slice, None (a new dim), ... (the dims left), integer indices
    IndexItem = int | slice | EllipsisType | Tensor | list[int] | np.ndarray | None
    Index = IndexItem | tuple[IndexItem, ...]


class IndexingOps:
    """Tensor's indexing: `t[index]`, index_select and gather."""

    __slots__ = ()

    def __getitem__(self: Tensor, index: Index) -> Tensor:
        """numpy indexing: ints, slices (any step), None, Ellipsis and integer tensors/lists."""
        index = index if isinstance(index, tuple) else (index,)
        index = tuple(_checked_item(i) for i in index)
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("an index can only have a single ellipsis")
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices ({used}) for a tensor of shape {self.shape}")
        if Ellipsis in [i if not isinstance(i, core.Tensor) else None for i in index]:
            at = [i is Ellipsis if not isinstance(i, core.Tensor) else False
                  for i in index].index(True)
            index = index[:at] + (slice(None),) * (self.ndim - used) + index[at + 1:]
            used = self.ndim
        index = index + (slice(None),) * (self.ndim - used)
        x, dim = self, 0
        crop, flips, steps = [], [], []
        for i in index:
            if i is None:
                continue
            size = self.shape[dim]
            if isinstance(i, slice):
                start, stop, step = i.indices(size)
                if step > 0:
                    lo, hi = start, max(start, stop)
                else:
                    lo, hi = (stop + 1, start + 1) if start > stop else (0, 0)
                    flips.append(dim)
                crop.append((lo, hi))
                steps.append(abs(step))
            elif isinstance(i, core.Tensor | list | np.ndarray):
                crop.append((0, size))
                steps.append(1)
            else:
                k = i
                if not -size <= k < size:
                    raise IndexError(f"index {k} is out of bounds for dimension {dim} "
                                     f"with size {size}")
                k %= size
                crop.append((k, k + 1))
                steps.append(1)
            dim += 1
        x = x.shrink(crop).flip(flips)
        if any(s != 1 for s in steps):
            x = x._stride(steps)
        # drop int-indexed dims, insert None dims, gather tensor-indexed dims
        advanced = any(isinstance(i, core.Tensor | list | np.ndarray) for i in index)
        dim, shape, gathers = 0, [], []
        for i in index:
            if i is None:
                shape.append(1)
                continue
            if isinstance(i, slice):
                shape.append(x.shape[dim])
            elif isinstance(i, core.Tensor | list | np.ndarray):
                gathers.append((len(shape), i))
                shape.append(x.shape[dim])
            elif advanced:      # beside integer tensors an int is one more of them (numpy)
                gathers.append((len(shape), 0))
                shape.append(1)
            dim += 1
        x = x.reshape(tuple(shape))
        return x._gather_dims(gathers) if gathers else x

    def _gather_dims(self: Tensor, gathers: list[tuple[int, Any]]) -> Tensor:
        """numpy's advanced indexing: integer indices at several dims, broadcast together.

        Their result dims replace the indexed dims where those are adjacent, else lead.
        """
        dims = [at for at, _ in gathers]
        sizes = [self.shape[d] for d in dims]
        flat, flat_dims = None, []
        for (_, i), n in zip(gathers, sizes):
            kind = i.dtype.kind if isinstance(i, core.Tensor) else np.asarray(i).dtype.kind
            if kind not in ("int", "uint", "i", "u"):
                raise IndexError(f"tensors used as indices must be integer, got {kind} ones; "
                                 "cast them with .cast(portkit.int32)")
            _check_known_index(i, n, dims[len(flat_dims)], negative=True)
            flat_dims.append(None)
            i = i.cast(int32) if isinstance(i, core.Tensor) else core.Tensor(
                np.asarray(i), int32, self.device)
            i = (i < 0).where(i + n, i)
            flat = i if flat is None else flat * n + i
        at = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
        rest = [d for d in range(self.ndim) if d not in dims]
        x = self.permute(rest[:at] + dims + rest[at:])
        x = x.reshape(x.shape[:at] + (math.prod(sizes),) + x.shape[at + len(dims):])
        return x.index_select(at, flat)

    def _stride(self: Tensor, steps: list[int]) -> Tensor:
        x = self
        for dim, step in enumerate(steps):
            if step == 1:
                continue
            n = x.shape[dim]
            count = -(-n // step)
            padding = [(0, 0)] * x.ndim
            padding[dim] = (0, count * step - n)
            x = x.pad(padding)
            x = x.reshape(x.shape[:dim] + (count, step) + x.shape[dim + 1:])
            arg = [(0, s) for s in x.shape]
            arg[dim + 1] = (0, 1)
            x = x.shrink(arg).reshape(x.shape[:dim] + (count,) + x.shape[dim + 2:])
        return x

    def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """self indexed along `dim` by an integer tensor of any shape (negative counts from the
        end): the result has index's dims in place of `dim`."""
        if index.dtype.is_float or index.dtype == bool_:
            raise IndexError(f"tensors used as indices must be integer, got {index.dtype.name}")
        dim = as_axes(dim, self.ndim)[0]
        n = self.shape[dim]
        _check_known_index(index, n, dim, negative=True)
        index = index.cast(int32)
        index = (index < 0).where(index + n, index)
        before, after = self.shape[:dim], self.shape[dim + 1:]
        hot = index.unsqueeze(-1) == core.Tensor.arange(n, device=self.device)
        hot = hot.reshape((1,) * len(before) + hot.shape + (1,) * len(after))
        x = self.reshape(before + (1,) * index.ndim + (n,) + after)
        value_dtype = self.dtype if self.dtype != bool_ else int32
        picked = hot.where(x.cast(value_dtype), 0).sum(len(before) + index.ndim,
                                                       dtype=value_dtype)
        return picked.cast(self.dtype)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather)."""
        if index.ndim != self.ndim:
            raise ValueError(f"gather: index has {index.ndim} dims, input {self.ndim}; they "
                             "must have the same number (torch.gather)")
        if index.dtype.is_float or index.dtype == bool_:
            raise TypeError(f"gather: index must be an integer tensor, got {index.dtype.name}")
        dim = as_axes(dim, self.ndim)[0]
        if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
            raise ValueError(f"gather: index shape {index.shape} is larger than input shape "
                             f"{self.shape} outside dim {dim}")
        n = self.shape[dim]
        _check_known_index(index, n, dim, negative=False)
        crop = [(0, s) if d == dim else (0, i) for d, (s, i) in
                enumerate(zip(self.shape, index.shape))]
        # self's `dim` moves to a new last axis, compared there with a one-hot of the index
        order = [d for d in range(self.ndim + 1) if d != dim + 1] + [dim + 1]
        x = self.shrink(crop).unsqueeze(dim).permute(order)
        hot = index.cast(int32).unsqueeze(-1) == core.Tensor.arange(n, device=self.device)
        return hot.where(x, 0).sum(-1).cast(self.dtype)

    def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
        """gather along `dim` with self and indices broadcast to each other outside it; with
        dim=None, of the flattened tensor (torch.take_along_dim)."""
        if dim is None:
            return self.flatten().gather(0, indices.flatten())
        if indices.ndim != self.ndim:
            raise ValueError(f"take_along_dim: indices have {indices.ndim} dims, input "
                             f"{self.ndim}; they must have the same number")
        dim = as_axes(dim, self.ndim)[0]
        try:
            outside = np.broadcast_shapes(*(tuple(1 if d == dim else n for d, n in
                                                  enumerate(t.shape)) for t in (self, indices)))
        except ValueError:
            raise ValueError(f"take_along_dim: input shape {self.shape} and indices shape "
                             f"{indices.shape} do not broadcast outside dim {dim}") from None

        def widened(t: Tensor) -> Tensor:
            return t.expand(*(t.shape[d] if d == dim else n for d, n in enumerate(outside)))
        return widened(self).gather(dim, widened(indices))

    def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float) -> Tensor:
        """A copy of self with self[..., index[..., i, ...], ...] = src[..., i, ...] along `dim`
        (torch.scatter)."""
        hot, values = self._scatter_onehot(dim, index, src)
        # where indices repeat, the last write wins (what PyTorch's CPU kernel does)
        order = core.Tensor.arange(hot.shape[-1], device=self.device)
        last = hot.where(order, -1).amax(-1, keepdim=True)
        picked = (hot & (order == last)).where(values, 0).sum(-1)
        return (last >= 0).squeeze(-1).where(picked.cast(self.dtype), self)

    def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """self plus src added at index along `dim` (torch.scatter_add); repeats accumulate."""
        hot, values = self._scatter_onehot(dim, index, src)
        return self + hot.where(values, 0).sum(-1).cast(self.dtype)

    def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                       include_self: bool = True) -> Tensor:
        """self with src reduced ("sum", "prod", "mean", "amax", "amin") into the positions
        index names along `dim`, with self's value too if include_self (torch.scatter_reduce);
        positions nothing is scattered to keep self's value."""
        if reduce not in _SCATTER_IDENTITY:
            raise ValueError(f"scatter_reduce: reduce must be one of "
                             f"{', '.join(_SCATTER_IDENTITY)}, got {reduce!r}")
        hot, values = self._scatter_onehot(dim, index, src)
        hit = hot.any(-1)
        identity = _SCATTER_IDENTITY[reduce]
        if identity is None:            # amax, amin: the dtype's extreme
            low = float("-inf") if self.dtype.is_float else self.dtype.min
            high = float("inf") if self.dtype.is_float else self.dtype.max
            identity = low if reduce == "amax" else high
        picked = hot.where(values, identity)
        if include_self:
            picked = picked.cat(self.unsqueeze(-1).cast(picked.dtype), dim=-1)
        if reduce == "mean":
            count = hot.sum(-1) + int(include_self)
            total = picked.sum(-1)
            out = total / count if self.dtype.is_float else total // count.cast(total.dtype)
        else:
            out = getattr(picked, {"sum": "sum", "prod": "prod"}.get(reduce, reduce))(-1)
        return hit.where(out.cast(self.dtype), self)

    def _scatter_onehot(self: Tensor, dim: int, index: Tensor, src: Tensor | float):
        """(hot, values) over a new last axis running over index's elements along `dim`:
        hot[..., j, ..., i] says index's element i (along dim) writes to position j."""
        if index.ndim != self.ndim:
            raise ValueError(f"scatter: index has {index.ndim} dims, self {self.ndim}")
        dim = as_axes(dim, self.ndim)[0]
        n = self.shape[dim]
        _check_known_index(index, n, dim, negative=False)
        if not isinstance(src, core.Tensor):
            src = index.full_like(src, self.dtype)
        crop = [(0, s) for s in index.shape]
        src = src.shrink(crop).cast(self.dtype)
        pad = [(0, a - b) if d != dim else (0, 0)
               for d, (a, b) in enumerate(zip(self.shape, index.shape))]
        # positions of self outside index's extent (other dims) are never written
        index_inside = index.cast(int32).pad(pad, -1)
        src = src.pad(pad)
        # move the scattered dim of index/src last, then compare with each position j of self
        order = [d for d in range(self.ndim) if d != dim] + [dim]
        idx, val = index_inside.permute(order), src.permute(order)
        positions = core.Tensor.arange(n, device=self.device).reshape(
            (1,) * dim + (n,) + (1,) * (self.ndim - dim - 1) + (1,))
        shape = idx.shape[:dim] + (1,) + idx.shape[dim:]
        hot = idx.reshape(shape) == positions
        values = val.reshape(shape).expand(hot.shape[:dim] + (n,) + hot.shape[dim + 1:])
        return hot, values


# what a position starts from before the scattered values reduce into it (None: the dtype's
# extreme, which amax and amin start from)
_SCATTER_IDENTITY = {"sum": 0, "prod": 1, "mean": 0, "amax": None, "amin": None}


def _checked_item(item: Any) -> Any:
    """One index item, with True as a new dim (numpy, PyTorch) and anything but an integer,
    slice, None, Ellipsis or index array refused where it is written."""
    if item is True:
        return None
    if item is None or item is Ellipsis or isinstance(
            item, slice | list | np.ndarray | core.Tensor):
        return item
    if isinstance(item, bool):
        raise IndexError("indexing with False (an empty selection) is not supported")
    try:
        return operator.index(item)
    except TypeError:
        raise IndexError(f"only integers, slices, None, ... and integer tensors are valid "
                         f"indices, got {type(item).__name__} {item!r}; use int() to index "
                         f"with a number") from None


def _check_known_index(index: Any, size: int, dim: int, negative: bool) -> None:
    """IndexError naming the index and the size, for indices whose values the host holds (lists,
    arrays, realized tensors); an index still to be computed on the device is not read back."""
    if isinstance(index, core.Tensor):
        if not index.lazy.realized or index.numel() == 0:
            return
        values = index.numpy()
    else:
        values = np.asarray(index)
        if values.size == 0:
            return
    low = -size if negative else 0
    bad = values[(values < low) | (values >= size)]
    if bad.size:
        raise IndexError(f"index {int(bad.flat[0])} is out of bounds for dimension {dim} with "
                         f"size {size}")
