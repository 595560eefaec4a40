"""Indexing: numpy's basic and advanced indexing (`t[...]`), index_select and gather.

Basic indexing is movement (shrink, flip, strides by pad and reshape); integer-tensor indices
become a one-hot comparison summed over the indexed dim, which every device can run.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from portkit.tensor import core
from portkit.tensor.dtype import bool_, int32

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
                k = int(i)
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
        flat = None
        for (_, i), n in zip(gathers, sizes):
            kind = i.dtype.kind if isinstance(i, core.Tensor) else np.asarray(i).dtype.kind
            if kind not in ("int", "uint", "i", "u"):
                raise IndexError(f"tensors used as indices must be integer, got {kind} ones; "
                                 "cast them with .cast(portkit.int32)")
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
        n = self.shape[dim]
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
        dim = dim % self.ndim
        crop = [(0, s) if d == dim else (0, i) for d, (s, i) in
                enumerate(zip(self.shape, index.shape))]
        x = self.shrink(crop).unsqueeze(dim).transpose(dim + 1, -1)
        n = self.shape[dim]
        hot = index.cast(int32).unsqueeze(-1) == core.Tensor.arange(n, device=self.device)
        return hot.where(x, 0).sum(-1).cast(self.dtype)
