"""Sliding windows over spatial dims, as views (pad, expand, reshape, shrink, permute), and the
int-or-tuple arguments of the spatial functions: what convolutions and pools share."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

IntTuple = int | Sequence[int]


def ntuple(v: IntTuple, n: int, name: str = "stride", minimum: int = 1) -> tuple[int, ...]:
    """`v` as n ints >= minimum (one int, or one per dim); RuntimeError naming `name` else."""
    values = (v,) * n if isinstance(v, int) else tuple(v)
    if len(values) == 1 and n > 1:
        values *= n
    if len(values) != n or any(not isinstance(p, int) or p < minimum for p in values):
        raise RuntimeError(f"{name} must be an int or {n} ints >= {minimum}, got {v!r}")
    return values


def windows(x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
            dilation: tuple[int, ...]) -> Tensor:
    """Sliding windows over the last len(kernel) dims -> (..., *out, *kernel), as views."""
    keep = x.shape[:-len(kernel)]
    sizes = x.shape[-len(kernel):]
    noop = [(0, s) for s in keep]
    outs = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(sizes, dilation, kernel,
                                                                 stride)]
    if any(o <= 0 for o in outs):
        raise ValueError(f"input of spatial size {sizes} is smaller than kernel {kernel} "
                         f"(dilation {dilation})")
    reps = [-(-k * (i + d) // i) for k, i, d in zip(kernel, sizes, dilation)]
    x = x.reshape(keep + tuple(d for i in sizes for d in (1, i)))
    x = x.expand(keep + tuple(d for e, i in zip(reps, sizes) for d in (e, i)))
    x = x.reshape(keep + tuple(e * i for e, i in zip(reps, sizes)))
    x = x.shrink(noop + [(0, k * (i + d)) for k, i, d in zip(kernel, sizes, dilation)])
    x = x.reshape(keep + tuple(d for k, i, dd in zip(kernel, sizes, dilation)
                               for d in (k, i + dd)))
    x = x.shrink(noop + [r for k, o, s in zip(kernel, outs, stride)
                         for r in ((0, k), (0, o * s))])
    x = x.reshape(keep + tuple(d for k, o, s in zip(kernel, outs, stride)
                               for d in (k, o, s)))
    x = x.shrink(noop + [r for k, o in zip(kernel, outs) for r in ((0, k), (0, o), (0, 1))])
    x = x.reshape(keep + tuple(d for k, o in zip(kernel, outs) for d in (k, o)))
    n = len(keep)
    return x.permute(tuple(range(n)) + tuple(n + 2 * i + 1 for i in range(len(kernel))) +
                     tuple(n + 2 * i for i in range(len(kernel))))
