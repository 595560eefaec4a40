"""Ops whose result's shape depends on the values: nonzero, masked_select, unique. They read
the values back to the host (as PyTorch's synchronize with the device), so the graph behind
the tensor runs when they are called; the results are new tensors on the same device."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from portkit.tensor.dtype import bool_, int32

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


class SelectionOps:
    """Tensor's nonzero, masked_select and unique."""

    __slots__ = ()

    def nonzero(self: Tensor, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
        """The indices of the nonzero elements, (count, ndim) int32 in row-major order (torch
        gives int64), or one 1-d tensor per dim with as_tuple."""
        where = np.nonzero(self.numpy().reshape(self.shape or (1,)))
        if as_tuple:
            return tuple(type(self)(w.astype(np.int32), int32, self.device) for w in where)
        stacked = np.stack(where, -1) if self.ndim else np.zeros((len(where[0]), 0), np.int32)
        return type(self)(stacked.astype(np.int32), int32, self.device)

    def masked_select(self: Tensor, mask: Tensor) -> Tensor:
        """The elements where the bool `mask` (broadcast with self) is True, as a 1-d tensor;
        the gradient reaches each element picked."""
        if mask.dtype != bool_:
            raise TypeError(f"masked_select: mask must be bool, got {mask.dtype.name}")
        shape = np.broadcast_shapes(self.shape, mask.shape)
        picked = np.flatnonzero(np.broadcast_to(mask.numpy(), shape))
        flat = self.expand(shape).reshape(-1)
        return flat.index_select(0, type(self)(picked.astype(np.int32), int32, self.device))

    def unique(self: Tensor, sorted: bool = True, return_inverse: bool = False,
               return_counts: bool = False, dim: int | None = None
               ) -> Tensor | tuple[Tensor, ...]:
        """The distinct values (or slices along `dim`), sorted, as torch.unique; with
        return_inverse, where each element went; with return_counts, how often each occurs."""
        values, inverse, counts = np.unique(self.numpy(), return_inverse=True,
                                            return_counts=True, axis=dim)
        out = [type(self)(values, self.dtype, self.device)]
        if return_inverse:
            shape = self.shape if dim is None else (self.shape[dim],)
            out.append(type(self)(inverse.reshape(shape).astype(np.int32), int32, self.device))
        if return_counts:
            out.append(type(self)(counts.astype(np.int32), int32, self.device))
        return out[0] if len(out) == 1 else tuple(out)
