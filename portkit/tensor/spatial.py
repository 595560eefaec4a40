"""The nn functions over spatial dims, in 1, 2 and 3 dims as torch.nn.functional has them: pad
(constant, reflect, replicate, circular), convolution and transposed convolution, interpolate
and grid_sample; the pools live in pools.py and are importable from here too.

All are views (pad, shrink, expand, reshape) of the input into sliding windows, then an
elementwise op and a reduction, so autograd differentiates them with no rule of their own, except
the convolution: its gradients are given (autograd's "given_vjp") as a convolution of the output
gradient (the input's) and one matmul-shaped sum over the batch and output positions (the
weight's), where the windows' own gradient would sum nine shifted copies of a tensor nine times
the input's size.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import product
from typing import TYPE_CHECKING, Literal

import numpy as np

from portkit.tensor.autocast_mode import runs_in_low_precision
from portkit.tensor.dtype import float32, float_of, int32
from portkit.tensor.movement import cat
from portkit.tensor.pools import (  # noqa: F401  (the pools' home before pools.py)
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool2d,
    max_pool3d,
    max_unpool2d,
)
from portkit.tensor.windows import IntTuple, ntuple, windows

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

PadMode = Literal["constant", "reflect", "replicate", "circular"]


# -- padding -------------------------------------------------------------------------------------

def pad(input: Tensor, pad: Sequence[int], mode: PadMode = "constant",
        value: float | None = None) -> Tensor:
    """Pads the last len(pad) // 2 dims, (before, after) of the last dim first, as torch's:
    with `value`, or by reflecting, repeating the edge, or wrapping around."""
    if mode == "constant":
        return input.pad(tuple(pad), 0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise ValueError(f"pad: mode must be 'constant', 'reflect', 'replicate' or 'circular', "
                         f"got {mode!r}")
    if value:
        raise ValueError(f"pad: value is only for mode='constant', got value={value} with "
                         f"mode={mode!r}")
    if len(pad) % 2 or len(pad) // 2 > input.ndim or any(p < 0 for p in pad):
        raise ValueError(f"pad: mode {mode!r} needs pairs of sizes >= 0 for at most "
                         f"{input.ndim} dims, got {tuple(pad)}")
    x = input
    for k in range(len(pad) // 2):
        x = _pad_dim(x, input.ndim - 1 - k, pad[2 * k], pad[2 * k + 1], mode)
    return x


def _pad_dim(x: Tensor, dim: int, before: int, after: int, mode: str) -> Tensor:
    n = x.shape[dim]
    limit = n - 1 if mode == "reflect" else n if mode == "circular" else math.inf
    if n == 0 or max(before, after) > limit:
        raise RuntimeError(f"pad: {mode} padding ({before}, {after}) of dim {dim} needs at most "
                           f"{limit} per side for its size {n}; pad less or use 'constant'")

    def part(begin: int, end: int) -> Tensor:
        return x.shrink([(begin, end) if d == dim else None for d in range(x.ndim)])

    def edge(index: int, count: int) -> Tensor:
        one = part(index, index + 1)
        return one.expand(*(count if d == dim else s for d, s in enumerate(one.shape)))

    if mode == "reflect":
        head, tail = part(1, before + 1).flip(dim), part(n - 1 - after, n - 1).flip(dim)
    elif mode == "replicate":
        head, tail = edge(0, before), edge(n - 1, after)
    else:
        head, tail = part(n - before, n), part(0, after)
    return cat([t for t, size in ((head, before), (x, n), (tail, after)) if size], dim)


# -- convolution ---------------------------------------------------------------------------------

@runs_in_low_precision
def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntTuple = 1,
           padding: IntTuple | str = 0, dilation: IntTuple = 1, groups: int = 1) -> Tensor:
    """1-d convolution, (N, C, L) or unbatched (C, L) x (O, C/groups, k)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1)


@runs_in_low_precision
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntTuple = 1,
           padding: IntTuple | str = 0, dilation: IntTuple = 1, groups: int = 1) -> Tensor:
    """2-d convolution, (N, C, H, W) or unbatched (C, H, W) x (O, C/groups, kh, kw)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2)


@runs_in_low_precision
def conv3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntTuple = 1,
           padding: IntTuple | str = 0, dilation: IntTuple = 1, groups: int = 1) -> Tensor:
    """3-d convolution, (N, C, D, H, W) or unbatched x (O, C/groups, kd, kh, kw)."""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 3)


def _conv(input: Tensor, weight: Tensor, bias: Tensor | None, stride: IntTuple,
          padding: IntTuple | str, dilation: IntTuple, groups: int, d: int) -> Tensor:
    name = f"conv{d}d"
    if input.ndim == d + 1 and weight.ndim == d + 2:
        return _conv(input.unsqueeze(0), weight, bias, stride, padding, dilation, groups,
                     d).squeeze(0)
    if input.ndim != d + 2 or weight.ndim != d + 2:
        raise ValueError(f"{name} needs {d + 2}-d input (or {d + 1}-d unbatched) and a "
                         f"{d + 2}-d weight, got shapes {input.shape} and {weight.shape}")
    cin = input.shape[1]
    cout, cin_g, *kernel = weight.shape
    if groups < 1 or cin != cin_g * groups or cout % groups:
        raise ValueError(f"{name}: input shape {input.shape} and weight shape {weight.shape} "
                         f"do not match for groups={groups}")
    stride, dilation = ntuple(stride, d, "stride"), ntuple(dilation, d, "dilation")
    pads = _conv_padding(padding, kernel, stride, dilation, name)
    y = _correlate(input.detach(), weight.detach(), stride, pads, dilation, groups)
    if input.requires_grad or weight.requires_grad:
        y = y._prim("given_vjp", input, weight, arg=lambda g: (
            _input_grad(g, weight.detach(), input.shape, stride, pads, dilation, groups).cast(
                input.dtype),
            _weight_grad(g, input.detach(), weight.shape, stride, pads, dilation, groups).cast(
                weight.dtype)))
    return y if bias is None else y + bias.reshape(1, -1, *(1,) * d)


def _correlate(input: Tensor, weight: Tensor, stride: tuple[int, ...],
               pads: tuple[tuple[int, int], ...], dilation: tuple[int, ...],
               groups: int) -> Tensor:
    """The convolution's value: windows of the padded input times the weight, summed.

    The window's (in channel, *kernel) axes are read as one axis K in the weight's order, so
    the sum is a matmul over K (an implicit GEMM: M the output positions, N the output
    channels, A read through the windows in place) that codegen/pack.py blocks like any
    matmul. Against three sums over (channel, *kernel), which are not a matmul to it, this ran
    conv2d 8x64x56x56 3x3 at 1.4x, a 1x1 at 1.2x, a strided 3x3 or a 7x7 stem at 2.5-3x and a
    conv of 8 channels per group at 3x the speed (CPU, same process). A depthwise conv (one
    output channel per group) keeps the three sums: there K only adds a div and a mod per
    term (0.65x)."""
    d = len(stride)
    n = input.shape[0]
    cout, cin_g, *kernel = weight.shape
    x = windows(input.pad(((0, 0), (0, 0)) + pads), tuple(kernel), stride, dilation)
    out = x.shape[2:2 + d]
    per_group = cout // groups
    if per_group > 1:
        depth = cin_g * math.prod(kernel)
        # (n, groups, per_group, *out, K) times the weight (1, groups, per_group, *1, K)
        x = x.reshape(n, groups, cin_g, *out, *kernel).permute(
            0, 1, *range(3, 3 + d), 2, *range(3 + d, 3 + 2 * d)).reshape(
            n, groups, 1, *out, depth).expand(n, groups, per_group, *out, depth)
        w = weight.reshape(1, groups, per_group, *(1,) * d, depth)
        return (x * w).sum(-1).reshape(n, cout, *out)
    # (n, groups, per_group, *out, cin_g, *kernel) times the weight, summed over the last 1 + d
    x = x.reshape(n, groups, cin_g, 1, *out, *kernel).expand(
        n, groups, cin_g, per_group, *out, *kernel).permute(
        0, 1, 3, *range(4, 4 + d), 2, *range(4 + d, 4 + 2 * d))
    w = weight.reshape(1, groups, per_group, *(1,) * d, cin_g, *kernel)
    return (x * w).sum(tuple(range(3 + d, 4 + 2 * d))).reshape(n, cout, *out)


def _input_grad(g: Tensor, weight: Tensor, shape: tuple[int, ...], stride: tuple[int, ...],
                pads: tuple[tuple[int, int], ...], dilation: tuple[int, ...],
                groups: int) -> Tensor:
    """d conv / d input: the output gradient spread by the stride, padded, and correlated with
    the flipped weight (in and out channels swapped per group), a convolution itself. A strided
    conv without dilation takes it in phases (`_phase_input_grad`) instead: spread, s^2 - 1 of
    every s^2 terms would multiply a zero."""
    d = len(stride)
    cout, cin_g, *kernel = weight.shape
    if any(s > 1 for s in stride) and all(dd == 1 for dd in dilation):
        return _phase_input_grad(g, weight, shape, stride, pads, groups)
    x = g
    for axis, s in enumerate(stride, start=2):
        x = spread(x, axis, s)
    # before: the kernel's reach less the forward's padding; after: up to the input's size
    edges = [(dd * (k - 1) - lo, size - x.shape[2 + i] + lo)
             for i, (k, dd, (lo, _), size) in enumerate(zip(kernel, dilation, pads, shape[2:]))]
    x = x.pad(((0, 0), (0, 0)) + tuple((max(0, b), max(0, a)) for b, a in edges))
    if any(b < 0 or a < 0 for b, a in edges):
        x = x.shrink([None, None] + [(max(0, -b), x.shape[2 + i] - max(0, -a))
                                     for i, (b, a) in enumerate(edges)])
    w = weight.reshape(groups, cout // groups, cin_g, *kernel).transpose(1, 2).reshape(
        groups * cin_g, cout // groups, *kernel).flip(tuple(range(2, 2 + d)))
    return _correlate(x, w, (1,) * d, ((0, 0),) * d, dilation, groups)


def _phase_input_grad(g: Tensor, weight: Tensor, shape: tuple[int, ...],
                      stride: tuple[int, ...], pads: tuple[tuple[int, int], ...],
                      groups: int) -> Tensor:
    """d conv / d input of a strided conv as s^2 stride-1 convolutions (sub-pixel): input
    element i = s * m + q reads output o through tap t = i + lo - s * o only, so phase q of the
    input (its elements m = 0, 1, ...) is the output gradient correlated with the taps r, r +
    s, ... for r = (q + lo) mod s (a phase no tap reaches is zero). The phases are taken in the
    input's own positions, so each is as large as its share of the input (16 x 16 of a 32 x 32
    input at stride 2) and nothing is computed past its edges; they are padded into the input
    laid out as (..., H / s, s, W / s, s) and summed over one element, which gives the
    interleave a kernel of its own."""
    d = len(stride)
    n = g.shape[0]
    cout, cin_g, *kernel = weight.shape
    outs = g.shape[2:]
    blocks = [-(-size // s) for size, s in zip(shape[2:], stride)]
    total = None
    for phase in product(*(range(s) for s in stride)):
        # per dim: the first tap r, the taps r, r + s, ..., and the output m + base - u that
        # element m reads through tap r + s * u
        first = [(q + lo) % s for q, (lo, _), s in zip(phase, pads, stride)]
        base = [(q + lo) // s for q, (lo, _), s in zip(phase, pads, stride)]
        taps = [len(range(r, k, s)) for r, k, s in zip(first, kernel, stride)]
        count = [len(range(q, size, s)) for q, size, s in zip(phase, shape[2:], stride)]
        if 0 in taps or 0 in count:     # no tap reaches this phase (a 1x1 conv's odd positions)
            continue
        # the taps r, r + s, ... of each dim: a strided view of the weight
        w = weight.pad(((0, 0), (0, 0)) + tuple((0, t * s - k + r) if t * s + r > k else (0, 0)
                                                  for t, s, k, r in zip(taps, stride, kernel,
                                                                        first)))
        w = w.shrink([None, None] + [(r, r + t * s) for r, t, s in zip(first, taps, stride)])
        w = w.reshape(cout, cin_g, *(x for t, s in zip(taps, stride) for x in (t, s)))
        w = w.shrink([None, None] + [x for t in taps for x in ((0, t), (0, 1))]).reshape(
            cout, cin_g, *taps)
        w = w.reshape(groups, cout // groups, cin_g, *taps).transpose(1, 2).reshape(
            groups * cin_g, cout // groups, *taps).flip(tuple(range(2, 2 + d)))
        # element m reads outputs m + base - taps + 1 ... m + base: the gradient from output
        # base - taps + 1 to output count + base - 1, zeros outside it
        edges = [(t - 1 - b, c + b - o) for t, b, c, o in zip(taps, base, count, outs)]
        x = g.pad(((0, 0), (0, 0)) + tuple((max(0, b), max(0, a)) for b, a in edges))
        x = x.shrink([None, None] + [(max(0, -b), x.shape[2 + i] - max(0, -a))
                                     for i, (b, a) in enumerate(edges)])
        part = _correlate(x, w, (1,) * d, ((0, 0),) * d, (1,) * d, groups)
        part = part.reshape(n, groups * cin_g, *(x for c in count for x in (c, 1))).pad(
            ((0, 0), (0, 0)) + tuple(x for q, s, c, b in zip(phase, stride, count, blocks)
                                     for x in ((0, b - c), (q, s - 1 - q))))
        total = part if total is None else total + part
    assert total is not None    # some phase has tap 0
    total = total.unsqueeze(-1).sum(-1).reshape(
        n, groups * cin_g, *(b * s for b, s in zip(blocks, stride)))
    return total.shrink([None, None] + [(0, size) for size in shape[2:]])


def _weight_grad(g: Tensor, input: Tensor, shape: tuple[int, ...], stride: tuple[int, ...],
                 pads: tuple[tuple[int, int], ...], dilation: tuple[int, ...],
                 groups: int) -> Tensor:
    """d conv / d weight: the input's windows times the output gradient, summed over the batch
    and the output positions."""
    d = len(stride)
    n = input.shape[0]
    cout, cin_g, *kernel = shape
    per_group = cout // groups
    x = windows(input.pad(((0, 0), (0, 0)) + pads), tuple(kernel), stride, dilation)
    out = x.shape[2:2 + d]
    dtype = g.dtype
    if dtype.is_float and dtype.itemsize == 2:     # 16-bit floats sum in float32 throughout
        x, g = x.cast(float32), g.cast(float32)
    if per_group < 8:
        return _weight_grad_lanes(g, x, shape, groups).cast(dtype)
    # One sum over (batch, *out) of (groups, cin_g, *kernel, cout_g) products: a matmul
    # whose m is (cin_g, *kernel), n the output channels and k the batch and output positions,
    # which codegen/pack.py blocks as one (tiles.match with `depths`): the windows (and an
    # elementwise producer of the gradient, relu's mask) are staged once per group and depth
    # block, and the multiply-adds are vector FMAs into 8 x 32 register blocks.
    x = x.reshape(n, groups, cin_g, *out, *kernel).permute(
        1, 2, *range(3 + d, 3 + 2 * d), 0, *range(3, 3 + d)).reshape(
        groups, 1, cin_g, *kernel, n, *out)
    dy = g.reshape(n, groups, per_group, *out).permute(1, 2, 0, *range(3, 3 + d)).reshape(
        groups, per_group, 1, *(1,) * d, n, *out)
    # summed in the weight's order (groups, cout_g, cin_g, *kernel): no permute after the sum
    dw = (x * dy).sum(tuple(range(3 + d, 4 + 2 * d)))
    return dw.reshape(shape).cast(dtype)


def _weight_grad_lanes(g: Tensor, x: Tensor, shape: tuple[int, ...], groups: int) -> Tensor:
    """The weight gradient of a conv with few output channels per group (a depthwise conv),
    no matmul to pack: the last output axis is cut into (out / lanes, lanes) and the lanes stay
    an output axis of a first sum, which also keeps the batch, so both operands are vector loads
    of partial sums and each group reads one image's planes. A second, short sum adds the batch
    and the lanes. `x` is the input's windows (n, cin, *out, *kernel), `g` the output's
    gradient, both float32 where the weight is a 16-bit float."""
    n = x.shape[0]
    cout, cin_g, *kernel = shape
    d = len(kernel)
    out = x.shape[2:2 + d]
    lanes = next(k for k in (8, 4, 2, 1) if out[-1] % k == 0)
    x = x.reshape(n, groups, 1, cin_g, *out[:-1], out[-1] // lanes, lanes, *kernel)
    dy = g.reshape(n, groups, cout // groups, 1, *out[:-1], out[-1] // lanes, lanes,
                   *(1,) * d)
    # (n, groups, cin_g, *kernel, cout_g, *out[:-1], out / lanes, lanes)
    order = (0, 1, 3, *range(5 + d, 5 + 2 * d), 2, *range(4, 5 + d))
    dw = (dy.permute(order) * x.permute(order)).sum(tuple(range(4 + d, 4 + 2 * d)))
    dw = dw.sum(0).sum(-1).reshape(groups, cin_g, *kernel, cout // groups)
    return dw.permute(0, 2 + d, 1, *range(2, 2 + d)).reshape(shape)


def _conv_padding(padding: IntTuple | str, kernel: Sequence[int], stride: tuple[int, ...],
                  dilation: tuple[int, ...], name: str) -> tuple[tuple[int, int], ...]:
    """(before, after) per spatial dim; "same" puts the odd element after, as torch."""
    if padding == "valid":
        return tuple((0, 0) for _ in kernel)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ValueError(f"{name}: padding='same' needs stride 1, got stride {stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in ntuple(padding, len(kernel), "padding", 0))


@runs_in_low_precision
def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None,
                     stride: IntTuple = 1, padding: IntTuple = 0, output_padding: IntTuple = 0,
                     groups: int = 1, dilation: IntTuple = 1) -> Tensor:
    """The gradient of conv1d with respect to its input: weight (C, O/groups, k)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 1)


@runs_in_low_precision
def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None,
                     stride: IntTuple = 1, padding: IntTuple = 0, output_padding: IntTuple = 0,
                     groups: int = 1, dilation: IntTuple = 1) -> Tensor:
    """The gradient of conv2d with respect to its input: weight (C, O/groups, kh, kw)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 2)


@runs_in_low_precision
def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None,
                     stride: IntTuple = 1, padding: IntTuple = 0, output_padding: IntTuple = 0,
                     groups: int = 1, dilation: IntTuple = 1) -> Tensor:
    """The gradient of conv3d with respect to its input: weight (C, O/groups, kd, kh, kw)."""
    return _conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                           dilation, 3)


def _conv_transpose(input: Tensor, weight: Tensor, bias: Tensor | None, stride: IntTuple,
                    padding: IntTuple, output_padding: IntTuple, groups: int,
                    dilation: IntTuple, d: int) -> Tensor:
    name = f"conv_transpose{d}d"
    if input.ndim == d + 1 and weight.ndim == d + 2:
        return _conv_transpose(input.unsqueeze(0), weight, bias, stride, padding,
                               output_padding, groups, dilation, d).squeeze(0)
    if input.ndim != d + 2 or weight.ndim != d + 2 or groups < 1 or \
            weight.shape[0] != input.shape[1] or input.shape[1] % groups:
        raise ValueError(f"{name}: input shape {input.shape} and weight shape {weight.shape} "
                         f"do not match for groups={groups} (weight is (C_in, C_out/groups, "
                         f"*kernel))")
    stride, dilation = ntuple(stride, d, "stride"), ntuple(dilation, d, "dilation")
    padding = ntuple(padding, d, "padding", 0)
    extra = ntuple(output_padding, d, "output_padding", 0)
    if any(e >= max(s, dd) for e, s, dd in zip(extra, stride, dilation)):
        raise ValueError(f"{name}: output_padding {extra} must be smaller than stride {stride} "
                         f"or dilation {dilation}")
    cin, cout_g, *kernel = weight.shape
    if groups == 1 and tuple(kernel) == stride and dilation == (1,) * d:
        y = unfolded_transpose(input, weight, tuple((-p, e - p) for p, e in zip(padding, extra)))
        return y if bias is None else y + bias.reshape(1, -1, *(1,) * d)
    # a stride-1 convolution of the input spread out by `stride`, with the kernel flipped and
    # its in/out channels swapped per group
    x = input
    for axis, s in enumerate(stride, start=2):
        x = spread(x, axis, s)
    pads = tuple((dd * (k - 1) - p, dd * (k - 1) - p + e)
                 for k, dd, p, e in zip(kernel, dilation, padding, extra))
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).transpose(1, 2).reshape(
        groups * cout_g, cin // groups, *kernel).flip(tuple(range(2, 2 + d)))
    y = _conv(x.pad(((0, 0), (0, 0)) + pads), w, None, 1, 0, dilation, groups, d)
    return y if bias is None else y + bias.reshape(1, -1, *(1,) * d)


def unfolded_transpose(x: Tensor, weight: Tensor, pads: Sequence[tuple[int, int]]) -> Tensor:
    """A transposed conv whose stride is its kernel (a U-Net's 2x2, stride 2), then `pads`
    (before, after; negative crops) on its spatial axes: its windows do not overlap, so it is
    one matmul (positions x C_in) @ (C_in x C_out * taps) and a permute that puts each
    position's taps beside it, where the spread conv's products are three quarters zeros read
    through a gate."""
    n, cin, *size = x.shape
    cout, kernel, d = weight.shape[1], weight.shape[2:], len(size)
    taps = x.reshape(n, cin, math.prod(size)).transpose(1, 2) @ weight.reshape(cin, -1)
    taps = taps.reshape(n, *size, cout, *kernel)
    order = (0, d + 1) + tuple(a for i in range(d) for a in (1 + i, d + 2 + i))
    y = taps.permute(*order).reshape(n, cout, *(s * k for s, k in zip(size, kernel)))
    return y.pad(((0, 0), (0, 0)) + tuple(pads))


def spread(x: Tensor, axis: int, stride: int) -> Tensor:
    """stride - 1 zeros between neighbours along `axis` (a transposed convolution's input,
    ONNX's Col2Im)."""
    if stride == 1 or x.shape[axis] == 0:
        return x
    n = x.shape[axis]
    x = x.unsqueeze(axis + 1).pad(tuple((0, stride - 1) if a == axis + 1 else (0, 0)
                                        for a in range(x.ndim + 1)))
    x = x.reshape(*x.shape[:axis], n * stride, *x.shape[axis + 2:])
    return x.shrink([(0, (n - 1) * stride + 1) if a == axis else None for a in range(x.ndim)])


# -- resampling ----------------------------------------------------------------------------------

def interpolate(input: Tensor, size: IntTuple | None = None,
                scale_factor: float | Sequence[float] | None = None,
                mode: Literal["nearest", "linear", "bilinear", "trilinear"] = "nearest",
                align_corners: bool | None = None) -> Tensor:
    """Resamples the spatial dims (all after N, C) to `size` or by `scale_factor`, as torch's:
    nearest, or (bi/tri)linear from the 2^d nearest input elements."""
    d = input.ndim - 2
    linear = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode != "nearest" and linear.get(mode) != d:
        raise ValueError(f"interpolate: mode {mode!r} needs {linear.get(mode, '1-3')} spatial "
                         f"dims after (N, C), got shape {input.shape}; use 'nearest', 'linear' "
                         "(3-d input), 'bilinear' (4-d) or 'trilinear' (5-d)")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("interpolate: align_corners is for the linear modes only")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: pass exactly one of size and scale_factor")
    spatial = input.shape[2:]
    if size is not None:
        sizes, scales = ntuple(size, d, "size", 0), [None] * d
    else:
        scales = [float(f) for f in ((scale_factor,) * d if isinstance(scale_factor, int | float)
                                     else scale_factor)]
        if len(scales) != d or any(f <= 0 for f in scales):
            raise ValueError(f"interpolate: scale_factor {scale_factor} needs {d} values > 0")
        sizes = tuple(math.floor(s * f) for s, f in zip(spatial, scales))
    x = input if mode == "nearest" else input.cast(float_of(input.dtype))
    for axis, (n, out, scale) in enumerate(zip(spatial, sizes, scales), start=2):
        x = _resample(x, axis, n, out, scale, mode == "nearest", bool(align_corners))
    return x


def _resample(x: Tensor, axis: int, n: int, out: int, scale: float | None, nearest: bool,
              align_corners: bool) -> Tensor:
    """x resampled along `axis` from n to out elements (positions as torch computes them, in
    float32 on the host)."""
    if nearest and out % n == 0 and scale in (None, out // n):
        return x.repeat_interleave(out // n, axis)
    step = np.float32(n / out if scale is None else 1 / scale)
    dst = np.arange(out, dtype=np.float32)
    if nearest:
        src = np.minimum(np.floor(dst * step).astype(np.int64), n - 1)
        return x.index_select(axis, _indices(src, x))
    if align_corners:
        src = dst * np.float32((n - 1) / (out - 1) if out > 1 else 0)
    else:
        src = np.maximum((dst + np.float32(0.5)) * step - np.float32(0.5), 0)
    low = np.minimum(np.floor(src).astype(np.int64), n - 1)
    high = np.minimum(low + 1, n - 1)
    weight = (src - low).astype(x.dtype.np).reshape((out,) + (1,) * (x.ndim - 1 - axis))
    weight = type(x)(weight, device=x.device)
    return x.index_select(axis, _indices(low, x)) * (1 - weight) + \
        x.index_select(axis, _indices(high, x)) * weight


def grid_sample(input: Tensor, grid: Tensor, mode: Literal["bilinear", "nearest"] = "bilinear",
                padding_mode: Literal["zeros", "border"] = "zeros",
                align_corners: bool = False) -> Tensor:
    """input (N, C, H, W) sampled at grid (N, Ho, Wo, 2) of (x, y) in [-1, 1], as torch's:
    bilinear or nearest, outside read as 0 or as the nearest border element."""
    if input.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2 or grid.shape[0] != \
            input.shape[0]:
        raise ValueError(f"grid_sample: input must be (N, C, H, W) and grid (N, Ho, Wo, 2), got "
                         f"{input.shape} and {grid.shape} (5-d input is not supported)")
    if mode not in ("bilinear", "nearest") or padding_mode not in ("zeros", "border"):
        raise ValueError(f"grid_sample: mode must be 'bilinear' or 'nearest' and padding_mode "
                         f"'zeros' or 'border', got {mode!r} and {padding_mode!r}")
    n, c, h, w = input.shape
    points = grid.shape[1] * grid.shape[2]
    flat = input.cast(float_of(input.dtype)).reshape(n, c, h * w)
    where = grid.cast(flat.dtype).reshape(n, points, 2)
    coords = []
    for axis, size in ((0, w), (1, h)):
        t = where[:, :, axis]
        t = (t + 1) * ((size - 1) / 2) if align_corners else ((t + 1) * size - 1) * 0.5
        coords.append(t.clip(0, size - 1) if padding_mode == "border" else t)
    ix, iy = coords

    def read(x: Tensor, y: Tensor) -> Tensor:
        """input at integer-valued float positions (n, points); 0 outside."""
        inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)
        index = (inside._where(y, 0.0) * w + inside._where(x, 0.0)).cast(int32)
        values = flat.gather(2, index.unsqueeze(1).expand(n, c, points))
        return inside.unsqueeze(1)._where(values, 0.0)

    if mode == "nearest":
        out = read(ix.detach().round(), iy.detach().round())
    else:
        x0, y0 = ix.detach().floor(), iy.detach().floor()
        wx, wy = (ix - x0).unsqueeze(1), (iy - y0).unsqueeze(1)
        out = ((read(x0, y0) * (1 - wx) + read(x0 + 1, y0) * wx) * (1 - wy) +
               (read(x0, y0 + 1) * (1 - wx) + read(x0 + 1, y0 + 1) * wx) * wy)
    return out.reshape(n, c, *grid.shape[1:3])


def _indices(values: np.ndarray, like: Tensor) -> Tensor:
    return type(like)(values.astype(np.int32), int32, like.device)
