"""Reductions over axes (sum, max, mean, var, argmax, softmax, ...) and matmul, a summed product."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from portkit.tensor.autocast_mode import runs_in_float32, runs_in_low_precision
from portkit.tensor.dtype import DTypeLike, bool_, int32, promote
from portkit.tensor.scan import SortResult
from portkit.tensor.shapes import AxisLike, accepts_dim, as_axes, as_dim

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


class ReduceOps:
    """Tensor's reductions; `axis` is an int, a sequence of ints, or None for every axis."""

    __slots__ = ()

    def _reduce_prim(self: Tensor, name: str, axes: tuple[int, ...]) -> Tensor:
        return self._prim(name, arg=axes) if axes else self

    def _reduce(self: Tensor, name: str, axis: AxisLike, keepdim: bool) -> Tensor:
        axes = as_axes(axis, self.ndim)
        out = self._reduce_prim(name, axes)
        if keepdim:
            return out
        return out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    @runs_in_float32
    @accepts_dim
    def sum(self: Tensor, axis: AxisLike = None, keepdim: bool = False,
            dtype: DTypeLike | None = None) -> Tensor:
        """The sum over `axis`; bool and small integers sum in int32 (where torch uses int64)."""
        x = self
        if dtype is not None:
            x = x.cast(dtype)
        elif x.dtype == bool_ or (x.dtype.is_int and x.dtype.itemsize < 4):
            x = x.cast(int32)
        return x._reduce("sum", axis, keepdim)

    @accepts_dim
    def amax(self: Tensor, axis: AxisLike = None, keepdim: bool = False) -> Tensor:
        """The largest element over `axis` (one or several dims; all if None)."""
        if self.dtype == bool_:
            return self.cast(int32).amax(axis, keepdim).cast(bool_)
        return self._reduce("max_reduce", axis, keepdim)

    @accepts_dim
    def amin(self: Tensor, axis: AxisLike = None, keepdim: bool = False) -> Tensor:
        """The smallest element over `axis` (one or several dims; all if None)."""
        return self._reversed().amax(axis, keepdim)._reversed()

    @accepts_dim
    def max(self: Tensor, axis: AxisLike | Tensor = None, keepdim: bool = False
            ) -> Tensor | SortResult:
        """The largest element; over one int dim, (values, indices) as torch.max (the first
        maximum's index); max(other_tensor) is maximum(). A tuple of dims gives amax()."""
        return self._extreme(axis, keepdim, method="amax")

    @accepts_dim
    def min(self: Tensor, axis: AxisLike | Tensor = None, keepdim: bool = False
            ) -> Tensor | SortResult:
        """The smallest element; over one int dim, (values, indices) as torch.min;
        min(other_tensor) is minimum(). A tuple of dims gives amin()."""
        return self._extreme(axis, keepdim, method="amin")

    def _extreme(self: Tensor, axis: AxisLike | Tensor, keepdim: bool, method: str
                 ) -> Tensor | SortResult:
        largest = method == "amax"
        if isinstance(axis, type(self)):
            return self.maximum(axis) if largest else self.minimum(axis)
        if not isinstance(axis, int):
            return getattr(self, method)(axis, keepdim)
        if not self.ndim:
            as_dim(axis, 0)
            return SortResult(self, self.zeros_like(int32))
        indices = self.argmax(axis, True) if largest else self.argmin(axis, True)
        # gathered, the gradient reaches the one element picked, as torch's (amax splits ties)
        values = self.gather(axis, indices)
        if not keepdim:
            values, indices = values.squeeze(axis), indices.squeeze(axis)
        return SortResult(values, indices)

    @runs_in_float32
    @accepts_dim
    def prod(self: Tensor, axis: AxisLike = None, keepdim: bool = False,
             dtype: DTypeLike | None = None) -> Tensor:
        """The product over `axis`, computed in `dtype` if given."""
        x = self if dtype is None else self.cast(dtype)
        if x.dtype == bool_:
            return (x == 0).amax(axis, keepdim) == 0     # the ABI has no bool MUL
        return x._reduce("prod_reduce", axis, keepdim)

    @runs_in_float32
    @accepts_dim
    def mean(self: Tensor, axis: AxisLike = None, keepdim: bool = False) -> Tensor:
        """The mean over `axis` (NaN over no elements)."""
        axes = as_axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        total = self._float().sum(axis, keepdim)
        return total / count if count else total * float("nan")

    @accepts_dim
    def var(self: Tensor, axis: AxisLike = None, keepdim: bool = False,
            correction: int = 1) -> Tensor:
        """The variance over `axis`, divided by count - correction (Bessel's by default)."""
        axes = as_axes(axis, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        x = self._float()
        centered = x - x.mean(axes, keepdim=True)
        return (centered * centered).sum(axes, keepdim) / max(count - correction, 0)

    @accepts_dim
    def std(self: Tensor, axis: AxisLike = None, keepdim: bool = False,
            correction: int = 1) -> Tensor:
        """The square root of var()."""
        return self.var(axis, keepdim, correction).sqrt()

    @accepts_dim
    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first maximum (int32)."""
        if axis is None:
            return self.reshape(-1).argmax(0)
        if not self.ndim:    # a 0-d tensor has one element, at index 0 of dim 0 (or -1)
            as_dim(axis, 0)
            return self.zeros_like(int32)
        axis = as_axes(axis, self.ndim)[0]
        n = self.shape[axis]
        hit = self == self.amax(axis, keepdim=True)
        if self.dtype.is_float:
            # a NaN is the maximum, as in PyTorch: where the axis has one, the first NaN wins
            nan = self.isnan()
            hit = nan.amax(axis, keepdim=True)._where(nan, hit)
        shape = [1] * self.ndim
        shape[axis] = n
        backwards = type(self).arange(n - 1, -1, -1, device=self.device).reshape(shape)
        return (n - 1) - (hit._where(backwards, -1)).amax(axis, keepdim)

    @accepts_dim
    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first minimum (int32)."""
        return self._reversed().argmax(axis, keepdim)

    @accepts_dim
    def logsumexp(self: Tensor, axis: AxisLike = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(self))) over `axis`, without overflow; -inf over no elements."""
        if not math.prod(self.shape[a] for a in as_axes(axis, self.ndim)):
            return self._float().exp().sum(axis, keepdim).log()    # log(0), as torch
        m = self.amax(axis, keepdim=True).detach()
        m = (m.abs() == float("inf"))._where(0.0, m)
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.reshape(
            tuple(s for i, s in enumerate(self.shape) if i not in as_axes(axis, self.ndim)))

    @runs_in_float32
    @accepts_dim
    def softmax(self: Tensor, axis: int = -1) -> Tensor:
        """exp(self) normalized to sum to 1 over `axis`."""
        if not self.numel():
            return self._float().exp()    # nothing to normalize: empty, as torch
        e = (self - self.amax(axis, keepdim=True).detach())._exp_of_nonpositive()
        return e / e.sum(axis, keepdim=True)

    @runs_in_float32
    @accepts_dim
    def log_softmax(self: Tensor, axis: int = -1) -> Tensor:
        """log(softmax(self)), computed without the intermediate exp."""
        return self - self.logsumexp(axis, keepdim=True)

    # -- products summed: the linear algebra ----------------------------------------------------

    def dot(self: Tensor, other: Tensor) -> Tensor:
        """The inner product of two 1-d tensors."""
        if self.ndim != 1 or other.ndim != 1:
            raise ValueError(f"dot needs two 1-d tensors, got shapes {self.shape} and "
                             f"{other.shape}")
        return self.matmul(other)

    @runs_in_low_precision
    def matmul(self: Tensor, other: Tensor) -> Tensor:
        """The matrix product, batched and broadcast over leading dims (numpy's rules)."""
        a, b = self, other
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul needs tensors with at least 1 dimension, got shapes "
                             f"{a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise ValueError(f"matmul shapes {a.shape} and {b.shape} do not match: "
                             f"{a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]}")
        squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
        a = a.unsqueeze(0) if squeeze_a else a
        b = b.unsqueeze(-1) if squeeze_b else b
        dtype = promote(a.dtype, b.dtype)
        # (..., M, 1, K) * (..., 1, N, K) summed over K
        out = (a.cast(dtype).unsqueeze(-2) * b.cast(dtype).transpose(-1, -2).unsqueeze(-3)
               ).sum(-1)
        if squeeze_a:
            out = out.squeeze(-2)
        if squeeze_b:
            out = out.squeeze(-1)
        return out
