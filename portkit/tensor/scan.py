"""Ops along one dim that compare or accumulate its elements: cumsum, cumprod, cummax, cummin,
sort, argsort, topk, any, all; and the triangle, diagonal and shifting ops (tril, triu, diag,
diagonal, roll, repeat_interleave, masked_fill).

Without a scan or sort in the ABI, these compare every pair along the dim (an n x n mask) and
reduce: O(n^2) work, fine for the sizes they meet in models (sequence positions, classes),
and differentiable through where and sum. topk of many elements ranks them in blocks first.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

from portkit.tensor.dtype import Scalar, bfloat16, bool_, float16, float32, int32
from portkit.tensor.shapes import AxisLike, as_dim

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


class SortResult(NamedTuple):
    """What sort and topk return, as torch's (values, indices)."""

    values: Tensor
    indices: Tensor


class ScanOps:
    """Tensor's scans, sorts and triangle/diagonal ops."""

    __slots__ = ()

    def _pairs(self: Tensor, dim: int) -> tuple[Tensor, Tensor, int]:
        """self with `dim` moved last, as (..., n, 1) "this" and (..., 1, n) "other" views."""
        x = self.transpose(dim, -1) if self.ndim else self.reshape(1)
        return x.unsqueeze(-1), x.unsqueeze(-2), x.shape[-1]

    def _unpair(self: Tensor, out: Tensor, dim: int) -> Tensor:
        return out.transpose(dim, -1) if self.ndim else out.reshape(())

    def cumsum(self: Tensor, dim: int) -> Tensor:
        """Running sums along `dim` (small ints and bool sum in int32)."""
        dim = as_dim(dim, self.ndim)
        _, other, n = self._pairs(dim)
        upto = _iota(self, n, 1) <= _iota(self, n, 0)     # other j <= this i
        picked = upto._where(other.expand(other.shape[:-2] + (n, n)), 0)
        return self._unpair(picked.sum(-1, dtype=_sum_dtype(self)), dim)

    def cumprod(self: Tensor, dim: int) -> Tensor:
        """Running products along `dim`."""
        dim = as_dim(dim, self.ndim)
        _, other, n = self._pairs(dim)
        upto = _iota(self, n, 1) <= _iota(self, n, 0)
        picked = upto._where(other.expand(other.shape[:-2] + (n, n)), 1)
        return self._unpair(picked.prod(-1), dim)

    def cummax(self: Tensor, dim: int) -> SortResult:
        """(values, indices) of the running maximum along `dim`, as torch.cummax: ties and
        NaN (which wins) give the latest index, and the gradient reaches that element."""
        dim = as_dim(dim, self.ndim)
        this, other, n = self._pairs(dim)
        this, other = this.detach(), other.detach()
        upto = _iota(self, n, 1) <= _iota(self, n, 0)
        # past position i, x_i itself stands in: it never exceeds the running maximum
        running = upto._where(other, this).amax(-1, keepdim=True)
        hit = upto & _same(other, running)
        indices = self._unpair(hit._where(_iota(self, n, 1), -1).amax(-1), dim)
        return SortResult(self.gather(dim, indices) if self.ndim else self, indices)

    def cummin(self: Tensor, dim: int) -> SortResult:
        """(values, indices) of the running minimum along `dim`, as torch.cummin."""
        indices = self._reversed().cummax(dim).indices
        return SortResult(self.gather(dim, indices) if self.ndim else self, indices)

    def logcumsumexp(self: Tensor, dim: int) -> Tensor:
        """log(cumsum(exp(self))) along `dim`, without overflow."""
        dim = as_dim(dim, self.ndim)
        _, other, n = self._pairs(dim)
        upto = _iota(self, n, 1) <= _iota(self, n, 0)
        picked = upto._where(other._float().expand(other.shape[:-2] + (n, n)), float("-inf"))
        return self._unpair(picked.logsumexp(-1), dim)

    def sort(self: Tensor, dim: int = -1, descending: bool = False,
             stable: bool = True) -> SortResult:
        """(values, indices) sorted along `dim`; ties keep their order, NaN sorts as the
        largest value (last ascending, first descending), as torch.sort."""
        dim = as_dim(dim, self.ndim)
        n = self.shape[dim] if self.ndim else 1
        indices = self._unpair(self._order(dim, descending, n), dim)
        return SortResult(self.gather(dim, indices) if self.ndim else self, indices)

    def _order(self: Tensor, dim: int, descending: bool, count: int) -> Tensor:
        """The indices of the elements that sort first along `dim`, `count` of them, in order
        (moved last): each element's rank counts the elements that sort before it."""
        if self.dtype in (float32, float16, bfloat16):
            this, other, n = self.detach()._sort_key(descending)._pairs(dim)
            # j sorts before i: a higher key, or the same key and j < i (the key at most
            # 0x7fc00000, so one more does not overflow)
            rank = ((other + (_iota(self, n, 1) < _iota(self, n, 0))) > this).sum(-1)
        else:
            this, other, n = self._pairs(dim)
            this, other = this.detach(), other.detach()
            before = _before(other, this, descending)     # element j sorts before element i
            ties = _same(other, this) & (_iota(self, n, 1) < _iota(self, n, 0))
            rank = (before | ties).sum(-1)                               # (..., n) position of i
        # position p takes the element i whose rank is p
        hit = rank.unsqueeze(-2) == _iota(self, count, 0)         # (..., p, i)
        return hit._where(_iota(self, n, 1), 0).sum(-1)

    def _sort_key(self: Tensor, descending: bool) -> Tensor:
        """An int32 per element (float32 or narrower) that orders as the values do in a sort,
        higher first: -0.0 as 0.0, NaN (any) above +inf. A compare per pair of keys replaces a
        compare, two NaN tests and a test for equality."""
        x = self.cast(float32)
        x = x.isnan()._where(float("nan"), (x == 0)._where(0.0, x))  # one NaN, one zero
        bits = x.bitcast(int32)
        key = bits ^ ((bits >> 31) & 0x7FFFFFFF)       # negative floats: the lower bits flipped
        return key if descending else -key

    def argsort(self: Tensor, dim: int = -1, descending: bool = False,
                stable: bool = True) -> Tensor:
        """The indices that sort self along `dim` (sort(...).indices)."""
        return self.sort(dim, descending).indices

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True,
             sorted: bool = True) -> SortResult:
        """The k largest (or smallest) elements along `dim` and their indices, in order."""
        dim = as_dim(dim, self.ndim)
        n = self.shape[dim] if self.ndim else 1
        if not 0 <= k <= n:
            raise RuntimeError(f"topk: k ({k}) is out of range for a dim of size {n}")
        if not self.ndim:
            return self.sort(dim, descending=largest)
        row = self.transpose(dim, -1)
        indices = row._top(k, largest).transpose(dim, -1)
        return SortResult(self.gather(dim, indices), indices)

    def _top(self: Tensor, k: int, largest: bool) -> Tensor:
        """The indices of the k first elements along the last dim, in order.

        Ranking compares every pair: n^2 work for n elements. In blocks of b, only each
        block's k first can be among the k first of all (padding sorts last, and the
        candidates keep the order of the index among equal values, so ties do too): n * b
        work, then the top k of the n / b * k candidates, in blocks again where that is less
        work. The 100 best scores of 12288 anchors: 151M comparisons in one rank, 12M in
        blocks of 512 and then all 2400 candidates, 8.9M with the candidates in blocks too."""
        n, last = self.shape[-1], self.ndim - 1
        block = _block(n, k) if self.dtype.is_float else None
        if block is None:
            return self._order(last, largest, k)
        blocks = -(-n // block)
        padded = self.detach().pad(((0, 0),) * last + ((0, blocks * block - n),),
                                   float("-inf") if largest else float("inf"))
        grouped = padded.reshape(self.shape[:-1] + (blocks, block))
        first = _iota(self, blocks, 0) * block
        positions = (grouped._order(last + 1, largest, k) + first).reshape(
            self.shape[:-1] + (blocks * k,))
        candidates = padded.gather(last, positions)
        return positions.gather(last, candidates._top(k, largest))

    def any(self: Tensor, dim: AxisLike = None, keepdim: bool = False) -> Tensor:
        """True where any element over `dim` is nonzero."""
        return (self != 0).amax(dim, keepdim)

    def all(self: Tensor, dim: AxisLike = None, keepdim: bool = False) -> Tensor:
        """True where every element over `dim` is nonzero."""
        return ~((self == 0).amax(dim, keepdim))

    def masked_fill(self: Tensor, mask: Tensor, value: Tensor | Scalar) -> Tensor:
        """self with `value` wherever the bool `mask` (broadcast) is True."""
        if mask.dtype != bool_:
            raise TypeError(f"masked_fill: mask must be bool, got {mask.dtype.name}")
        return mask._where(value, self).cast(self.dtype)

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two dims (col - row <= diagonal), the rest 0."""
        return self._triangle(lambda rows, cols: cols - rows <= diagonal)

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two dims (col - row >= diagonal), the rest 0."""
        return self._triangle(lambda rows, cols: cols - rows >= diagonal)

    def _triangle(self: Tensor, keep) -> Tensor:
        if self.ndim < 2:
            raise RuntimeError(f"tril/triu need at least 2 dims, got shape {self.shape}")
        n, m = self.shape[-2:]
        rows, cols = _iota(self, n, 0), _iota(self, m, 1)
        zero = False if self.dtype == bool_ else 0
        return keep(rows, cols)._where(self, zero).cast(self.dtype)

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of dims dim1, dim2 (above it for offset > 0), as a new last dim."""
        dim1, dim2 = as_dim(dim1, self.ndim), as_dim(dim2, self.ndim)
        if dim1 == dim2:
            raise RuntimeError(f"diagonal: dim1 and dim2 are both {dim1}")
        rest = [d for d in range(self.ndim) if d not in (dim1, dim2)]
        x = self.permute(rest + [dim1, dim2])
        n, m = x.shape[-2:]
        rows, cols = (0, offset) if offset >= 0 else (-offset, 0)
        length = max(0, min(n - rows, m - cols))
        crop = [(0, s) for s in x.shape[:-2]] + [(rows, rows + length), (cols, cols + length)]
        x = x.shrink(crop) if length else x.shrink(crop[:-2] + [(0, 0), (0, 0)])
        if not length:
            return x.reshape(x.shape[:-2] + (0,))
        # row r of the flat square starts at r * length; padded to rows of length + 1, the
        # diagonal lines up in column 0
        flat = x.reshape(x.shape[:-2] + (length * length,))
        flat = flat.pad(((0, 0),) * (flat.ndim - 1) + ((0, length),))
        return flat.reshape(x.shape[:-2] + (length, length + 1))[..., 0]

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """A 1-d tensor as the diagonal of a square matrix, or a matrix's diagonal as 1-d."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise RuntimeError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
        size = self.shape[0] + abs(diagonal)
        padded = self.pad(((0, abs(diagonal)),))
        # above the diagonal, row r holds x[r]; below it, column c holds x[c]
        values = padded.reshape(size, 1) if diagonal >= 0 else padded.reshape(1, size)
        rows = _iota(self, size, 0)
        cols = _iota(self, size, 1)
        zero = False if self.dtype == bool_ else 0
        return (cols - rows == diagonal)._where(values, zero).cast(self.dtype)

    def roll(self: Tensor, shifts: int | tuple[int, ...],
             dims: int | tuple[int, ...] | None = None) -> Tensor:
        """Elements shifted along dims, wrapping around (flattened first if dims is None)."""
        if dims is None:
            return self.reshape(-1).roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise RuntimeError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        x = self
        for shift, dim in zip(shifts, dims):
            dim = as_dim(dim, x.ndim)
            n = x.shape[dim]
            if not n or shift % n == 0:
                continue
            head, tail = x.split([n - shift % n, shift % n], dim)
            x = tail.cat(head, dim=dim)
        return x

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        """Each element repeated `repeats` times along `dim` (flattened if dim is None)."""
        if not isinstance(repeats, int) or repeats < 0:
            raise TypeError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r} "
                            "(a tensor of repeats needs its values on the host: pass ints)")
        if dim is None:
            return self.reshape(-1).repeat_interleave(repeats, 0)
        dim = as_dim(dim, self.ndim)
        x = self.unsqueeze(dim + 1)
        x = x.expand(x.shape[:dim + 1] + (repeats,) + x.shape[dim + 2:])
        return x.reshape(self.shape[:dim] + (self.shape[dim] * repeats,) + self.shape[dim + 1:])


def _iota(like: Tensor, n: int, axis: int) -> Tensor:
    """arange(n) on `like`'s device as a column (axis 0: shape (n, 1)) or a row (axis 1:
    shape (1, n))."""
    index = type(like).arange(n, device=like.device)
    return index.reshape(n, 1) if axis == 0 else index.reshape(1, n)


def _block(n: int, k: int) -> int | None:
    """The block (a power of two of at least 2k) whose blocked top-k compares the fewest
    pairs, if that is under half of n^2; else None (rank all n at once)."""
    costs = _blocked_costs(n, k)
    best = min(costs, key=costs.get, default=None)
    return best if best is not None and 2 * costs[best] < n * n else None


@functools.cache
def _blocked_costs(n: int, k: int) -> dict[int, int]:
    """Pairs compared by the top k of n in blocks of b, per b: each block ranked, then the
    top k of the candidates, blocked again where that compares fewer."""
    costs = {}
    for b in (1 << e for e in range(max(2 * k - 1, 1).bit_length(), n.bit_length())):
        m = -(-n // b) * k
        block = _block(m, k)
        costs[b] = -(-n // b) * b * b + (_blocked_costs(m, k)[block] if block else m * m)
    return costs


def _sum_dtype(x: Tensor):
    return int32 if x.dtype == bool_ or (x.dtype.is_int and x.dtype.itemsize < 4) else x.dtype


def _before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
    """a sorts strictly before b; NaN is the largest value."""
    if not a.dtype.is_float:
        return a > b if descending else a < b
    a_nan, b_nan = a.isnan(), b.isnan()
    if descending:
        return (a > b) | (a_nan & ~b_nan)
    return (a < b) | (~a_nan & b_nan)


def _same(a: Tensor, b: Tensor) -> Tensor:
    equal = a == b
    return equal | (a.isnan() & b.isnan()) if a.dtype.is_float else equal
