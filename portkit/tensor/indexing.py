"""Indexing: numpy's basic and advanced indexing (`t[...]`), index_select and gather.

Basic indexing is movement (shrink, flip, strides by pad and reshape); integer-tensor indices
are a GATHER (portkit/graph.py): a load whose position along the indexed dim is read from the
index, checked on the device (portkit/tensor/faults.py). Its gradient sums rows into the
positions they came from without a one-hot over the whole dim (`_gather_grad`).
"""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from portkit.graph import Gather, GraphOp
from portkit.tensor import faults
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
        index = tuple(_checked_item(type(self), i) for i in index)
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("an index can only have a single ellipsis")
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices ({used}) for a tensor of shape {self.shape}")
        if Ellipsis in [i if not isinstance(i, type(self)) else None for i in index]:
            at = [i is Ellipsis if not isinstance(i, type(self)) else False
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
            elif isinstance(i, type(self) | list | np.ndarray):
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
        advanced = any(isinstance(i, type(self) | list | np.ndarray) for i in index)
        dim, shape, gathers = 0, [], []
        for i in index:
            if i is None:
                shape.append(1)
                continue
            if isinstance(i, slice):
                shape.append(x.shape[dim])
            elif isinstance(i, type(self) | list | np.ndarray):
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
        for (dim, i), n in zip(gathers, sizes):
            kind = i.dtype.kind if isinstance(i, type(self)) else np.asarray(i).dtype.kind
            if kind not in ("int", "uint", "i", "u"):
                raise IndexError(f"tensors used as indices must be integer, got {kind} ones; "
                                 "cast them with .cast(portkit.int32)")
            i = _as_index(self, i, n, dim, wrap=True)
            if len(gathers) == 1:       # its own gather wraps and checks it: one kernel
                return self._take(dim, i, "index", wrap=True)
            # the positions of 0..n-1 the index names: the index wrapped, checked, clamped
            i = type(self).arange(n, device=self.device)._gather(0, i.reshape(-1), "index",
                                                                  wrap=True).reshape(i.shape)
            flat = i if flat is None else flat * n + i
        at = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
        rest = [d for d in range(self.ndim) if d not in dims]
        x = self.permute(rest[:at] + dims + rest[at:])
        x = x.reshape(x.shape[:at] + (math.prod(sizes),) + x.shape[at + len(dims):])
        return x._take(at, flat, "index", wrap=False, check=False)

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
        """self indexed along `dim` by an integer tensor of any shape: the result has index's
        dims in place of `dim`. A negative index is out of range, as in torch."""
        return self._take(dim, index, "index_select", wrap=False)

    def _take(self: Tensor, dim: int, index: Any, op: str, wrap: bool, check: bool = True
              ) -> Tensor:
        """index_select for `op` (named in its errors): with `wrap`, a negative index counts
        from the end once; without `check`, the caller knows the indices are in range."""
        if isinstance(index, type(self)) and (index.dtype.is_float or index.dtype == bool_):
            raise IndexError(f"{op}: tensors used as indices must be integer, got "
                             f"{index.dtype.name}")
        dim = as_axes(dim, self.ndim)[0]
        index = _as_index(self, index, self.shape[dim], dim, wrap, op)
        flat = index.reshape((1,) * dim + (index.numel(),) + (1,) * (self.ndim - dim - 1))
        taken = self._gather(dim, flat, op, wrap, check)
        return taken.reshape(self.shape[:dim] + index.shape + self.shape[dim + 1:])

    def _gather(self: Tensor, dim: int, index: Tensor, op: str, wrap: bool, check: bool = True
                ) -> Tensor:
        """The GATHER primitive: self with `dim` read at the positions `index` holds; index
        has self's ndim and, outside `dim`, self's size or 1 (the same index across it)."""
        size = self.shape[dim]
        if size == 0 and index.numel():
            raise IndexError(f"{op}: index into dimension {dim} of size 0 (shape {self.shape}): "
                             "every index is out of range")
        arg = Gather(dim, wrap, faults.code(op, dim, size, wrap) if check else 0)
        return self._prim("gather", index.cast(int32), self._wrap(faults.flag(self.device)),
                          arg=arg)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather); a
        negative index is out of range, as in torch."""
        return self._gather_elements(dim, index, "gather", wrap=False)

    def _gather_elements(self: Tensor, dim: int, index: Tensor, op: str, wrap: bool) -> Tensor:
        """gather for `op` (named in its errors); with `wrap`, a negative index counts from
        the end once (take_along_dim, ONNX GatherElements)."""
        if index.ndim != self.ndim:
            raise ValueError(f"{op}: index has {index.ndim} dims, input {self.ndim}; they "
                             "must have the same number (torch.gather)")
        if index.dtype.is_float or index.dtype == bool_:
            raise TypeError(f"{op}: index must be an integer tensor, got {index.dtype.name}")
        dim = as_axes(dim, self.ndim)[0]
        if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
            raise ValueError(f"{op}: index shape {index.shape} is larger than input shape "
                             f"{self.shape} outside dim {dim}")
        crop = [(0, s) if d == dim else (0, i) for d, (s, i) in
                enumerate(zip(self.shape, index.shape))]
        return self.shrink(crop)._gather(dim, _unexpanded(index, dim), op, wrap)

    def _gather_grad(self: Tensor, index: Tensor, arg: Gather, size: int) -> Tensor:
        """The gradient of a GATHER whose output gradient is self: self's rows summed into
        the `size` positions along `arg.axis` they were read from (a scatter-add)."""
        index = index.detach()
        if arg.wrap:
            index = (index < 0)._where(index + size, index)
        return scatter_sum(self.transpose(0, arg.axis), index.transpose(0, arg.axis),
                           size).transpose(0, arg.axis)

    def take_along_dim(self: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
        """gather along `dim` with self and indices broadcast to each other outside it; with
        dim=None, of the flattened tensor (torch.take_along_dim)."""
        if dim is None:
            return self.flatten()._gather_elements(0, indices.flatten(), "take_along_dim", True)
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
        return widened(self)._gather_elements(dim, widened(indices), "take_along_dim", True)

    def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float) -> Tensor:
        """A copy of self with self[..., index[..., i, ...], ...] = src[..., i, ...] along `dim`
        (torch.scatter)."""
        hot, values = self._scatter_onehot(dim, index, src)
        # where indices repeat, the last write wins (what PyTorch's CPU kernel does)
        order = type(self).arange(hot.shape[-1], device=self.device)
        last = hot._where(order, -1).amax(-1, keepdim=True)
        picked = (hot & (order == last))._where(values, 0).sum(-1)
        return (last >= 0).squeeze(-1)._where(picked.cast(self.dtype), self)

    def scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """self plus src added at index along `dim` (torch.scatter_add); repeats accumulate."""
        hot, values = self._scatter_onehot(dim, index, src)
        return self + hot._where(values, 0).sum(-1).cast(self.dtype)

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
        picked = hot._where(values, identity)
        if include_self:
            picked = picked.cat(self.unsqueeze(-1).cast(picked.dtype), dim=-1)
        if reduce == "mean":
            count = hot.sum(-1) + int(include_self)
            total = picked.sum(-1)
            out = total / count if self.dtype.is_float else total // count.cast(total.dtype)
        else:
            out = getattr(picked, {"sum": "sum", "prod": "prod"}.get(reduce, reduce))(-1)
        return hit._where(out.cast(self.dtype), self)

    def _scatter_onehot(self: Tensor, dim: int, index: Tensor, src: Tensor | float):
        """(hot, values) over a new last axis running over index's elements along `dim`:
        hot[..., j, ..., i] says index's element i (along dim) writes to position j."""
        if index.ndim != self.ndim:
            raise ValueError(f"scatter: index has {index.ndim} dims, self {self.ndim}")
        dim = as_axes(dim, self.ndim)[0]
        n = self.shape[dim]
        _check_known_index(self, index, n, dim, negative=False)
        if not isinstance(src, type(self)):
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
        positions = type(self).arange(n, device=self.device).reshape(
            (1,) * dim + (n,) + (1,) * (self.ndim - dim - 1) + (1,))
        shape = idx.shape[:dim] + (1,) + idx.shape[dim:]
        hot = idx.reshape(shape) == positions
        values = val.reshape(shape).expand(hot.shape[:dim] + (n,) + hot.shape[dim + 1:])
        return hot, values


# what a position starts from before the scattered values reduce into it (None: the dtype's
# extreme, which amax and amin start from)
_SCATTER_IDENTITY = {"sum": 0, "prod": 1, "mean": 0, "amax": None, "amin": None}


def _checked_item(kind: type[Tensor], item: Any) -> Any:
    """One index item (`kind`: the Tensor class), with True as a new dim (numpy, PyTorch) and anything but an integer,
    slice, None, Ellipsis or index array refused where it is written."""
    if item is True:
        return None
    if item is None or item is Ellipsis or isinstance(
            item, slice | list | np.ndarray | kind):
        return item
    if isinstance(item, bool):
        raise IndexError("indexing with False (an empty selection) is not supported")
    try:
        return operator.index(item)
    except TypeError:
        raise IndexError(f"only integers, slices, None, ... and integer tensors are valid "
                         f"indices, got {type(item).__name__} {item!r}; use int() to index "
                         f"with a number") from None


def _as_index(like: Tensor, index: Any, size: int, dim: int, wrap: bool, op: str = "index"
              ) -> Tensor:
    """`index` as an int32 Tensor on `like`'s device. Values the host holds (a list, an array) are checked here;
    a Tensor's are checked on the device, when a kernel reads them, and never read back."""
    if isinstance(index, type(like)):
        return index.cast(int32)
    values = np.asarray(index)
    _check_values(values, size, dim, wrap, op)
    return type(like)(values.astype(np.int32), int32, like.device)


def _unexpanded(index: Tensor, dim: int) -> Tensor:
    """`index` with the dims it is expanded along (other than `dim`) cut to size 1: GATHER
    reads one index across them, and its gradient compares that one instead of its copies."""
    lazy = index.lazy
    if lazy.op is not GraphOp.VIEW or len(lazy.arg.views) > 1 or lazy.arg.views[0].mask:
        return index
    strides = lazy.arg.views[0].strides
    return index.shrink([(0, 1) if d != dim and st == 0 else (0, n)
                         for d, (n, st) in enumerate(zip(index.shape, strides))])


def _check_values(values: np.ndarray, size: int, dim: int, negative: bool, op: str) -> None:
    low = -size if negative else 0
    bad = values[(values < low) | (values >= size)]
    if bad.size:
        raise IndexError(f"{op}: index {int(bad.flat[0])} is out of bounds for dimension {dim} "
                         f"with size {size}")


def _check_known_index(like: Tensor, index: Any, size: int, dim: int, negative: bool) -> None:
    """IndexError naming the index and the size, for indices whose values the host holds (lists,
    arrays, realized tensors, read back): the scatter ops have no device-side check."""
    if isinstance(index, type(like)):
        if not index.lazy.realized or index.numel() == 0:
            return
        values = index.numpy()
    else:
        values = np.asarray(index)
    _check_values(values, size, dim, negative, "scatter")


def scatter_sum(values: Tensor, index: Tensor, size: int) -> Tensor:
    """out[v, ...] = the sum of values[i, ...] over the i with index[i, ...] == v, for v below
    `size`; index (int32, in range) has values' ndim and, past dim 0, its sizes or 1.

    A one-hot compare costs size x m x row elements. Where that is more than the alternative,
    the rows sharing an index are summed along chains instead: next[i] is the next position
    holding the same index (m x m compares of the index alone), and log2(m) rounds of pointer
    jumping (sums[i] += sums[next[i]]; next[i] = next[next[i]]) leave each chain's total at its
    first position, which a gather reads: m x row x log2(m) elements in all, plus size x m
    compares of the index to find the first positions. Position m is a zero row every chain
    ends in, so the jumps need no mask.
    """
    m = values.shape[0]
    row, index_row = math.prod(values.shape[1:]), math.prod(index.shape[1:])
    rounds = max(m - 1, 0).bit_length()
    device, ones = values.device, (1,) * (values.ndim - 1)
    every = type(values).arange(size, device=device).reshape((size, 1) + ones)
    if size * m * row <= (m + size) * m * index_row + m * row * rounds:
        hot = index.unsqueeze(0) == every                       # (size, m, ...)
        return hot._where(values.unsqueeze(0), 0).sum(1)
    positions = type(values).arange(m, device=device)
    this, other = positions.reshape((m, 1) + ones), positions.reshape((1, m) + ones)
    later = (index.unsqueeze(1) == index.unsqueeze(0)) & (this < other)
    jump = later._where(other, m).amin(1).pad(((0, 1),) + ((0, 0),) * len(ones), m)
    sums = values.pad(((0, 1),) + ((0, 0),) * len(ones))
    for k in range(rounds):
        sums = sums + sums._gather(0, jump, "scatter_sum", wrap=False, check=False)
        if k + 1 < rounds:
            jump = jump._gather(0, jump, "scatter_sum", wrap=False, check=False)
    first = (index.unsqueeze(0) == every)._where(other, m).amin(1)      # (size, ...)
    return sums._gather(0, first, "scatter_sum", wrap=False, check=False)
