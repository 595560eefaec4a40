"""ONNX's signal and image ops as Tensor operations (see ops.py for the conventions): DFT and
STFT as products with cosine and sine matrices made on the host, AffineGrid, GridSample,
Col2Im, and the two elementwise ops of ai.onnx.ml (Binarizer, ArrayFeatureExtractor)."""
from __future__ import annotations

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat
from portkit.tensor.spatial import spread

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _along(x: Tensor, axis: int, matrix: np.ndarray, ctx: Context) -> Tensor:
    """x with `axis` mapped through the (out, in) matrix."""
    moved = x.transpose(axis, -1)
    weights = ctx.tensor(np.ascontiguousarray(matrix.T).astype(np.dtype(x.dtype.np)))
    return (moved @ weights).transpose(axis, -1)


def _fit(x: Tensor, axis: int, size: int) -> Tensor:
    """x cut or zero-padded to `size` along `axis`."""
    pads = [(0, 0)] * x.ndim
    pads[axis] = (0, size - x.shape[axis])
    return x.pad(tuple(pads)) if size != x.shape[axis] else x


@op("DFT")
def _dft(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    if ctx.opset >= 20:
        axis = ctx.ints(node.inputs[2])[0] if node.input(2) is not None else -2
    else:
        axis = node.attr("axis", 1)
    axis %= x.ndim
    inverse, onesided = node.attr("inverse", 0), node.attr("onesided", 0)
    length = node.input(1)
    length = ctx.ints(length)[0] if length is not None else (
        2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis])
    return [_spectrum(ctx, x, axis, length, inverse, onesided)]


def _spectrum(ctx: Context, x: Tensor, axis: int, length: int, inverse: bool, onesided: bool
              ) -> Tensor:
    """The DFT of x (real or complex in its last axis) along `axis`, `length` points."""
    real = x[..., 0]
    imag = x[..., 1] if x.shape[-1] == 2 else None
    if inverse and onesided:      # a one-sided spectrum in, a real signal out (irfft)
        count = length // 2 + 1
        k = np.arange(count)
        angle = 2 * np.pi * np.outer(np.arange(length), k) / length
        weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
        out = _along(_fit(real, axis, count), axis, np.cos(angle) * weight, ctx)
        if imag is not None:
            out = out - _along(_fit(imag, axis, count), axis, np.sin(angle) * weight, ctx)
        return out.unsqueeze(-1)
    count = length // 2 + 1 if onesided and not inverse else length
    angle = 2 * np.pi * np.outer(np.arange(count), np.arange(length)) / length
    cos, sin = np.cos(angle), np.sin(angle) * (1 if inverse else -1)
    if inverse:
        cos, sin = cos / length, sin / length
    real = _fit(real, axis, length)
    out_real, out_imag = _along(real, axis, cos, ctx), _along(real, axis, sin, ctx)
    if imag is not None:        # (a + ib)(cos + i sin)
        imag = _fit(imag, axis, length)
        out_real = out_real - _along(imag, axis, sin, ctx)
        out_imag = out_imag + _along(imag, axis, cos, ctx)
    return cat([out_real.unsqueeze(-1), out_imag.unsqueeze(-1)], -1)


@op("STFT")
def _stft(ctx: Context, node: NodeArgs) -> list[Value]:
    x, step = ctx.tensor(node.inputs[0]), ctx.ints(node.inputs[1])[0]
    window = None if node.input(2) is None else ctx.tensor(node.inputs[2])
    length = ctx.ints(node.inputs[3])[0] if node.input(3) is not None else window.shape[0]
    count = (x.shape[1] - length) // step + 1
    frames = cat([x[:, k * step:k * step + length].unsqueeze(1) for k in range(count)], 1)
    if window is not None:
        frames = frames * window.reshape(1, 1, length, 1)
    return [_spectrum(ctx, frames, 2, length, False, bool(node.attr("onesided", 1)))]


@op("AffineGrid")
def _affine_grid(ctx: Context, node: NodeArgs) -> list[Value]:
    theta, size = ctx.tensor(node.inputs[0]), ctx.ints(node.inputs[1])
    spatial = size[2:]
    if node.attr("align_corners", 0):
        axes = [np.linspace(-1, 1, n) if n > 1 else np.zeros(1) for n in spatial]
    else:
        axes = [(2 * np.arange(n) + 1) / n - 1 for n in spatial]
    # homogeneous points (x, y[, z], 1): x runs along the last axis
    mesh = np.meshgrid(*axes, indexing="ij")
    points = np.stack([m.reshape(-1) for m in mesh[::-1]] + [np.ones(mesh[0].size)], -1)
    grid = ctx.tensor(points.astype(np.dtype(theta.dtype.np))).unsqueeze(0) @ theta.transpose(1, 2)
    return [grid.reshape(size[0], *spatial, len(spatial))]


def _reflect(x: Tensor, low: float, high: float) -> Tensor:
    """x mirrored at `low` and `high` until it lies between them."""
    span = high - low
    if span <= 0:
        return x.clip(low, high)
    below, distance = x < low, (x < low)._where(low - x, x - high)
    folds = (distance / span).trunc()
    rest = distance - folds * span
    even = (folds % 2) == 0
    folded = below._where(even._where(low + rest, high - rest), even._where(high - rest, low + rest))
    return ((x < low) | (x > high))._where(folded, x).cast(x.dtype)


def _cubic(t: Tensor) -> list[Tensor]:
    a = -0.75
    s, u = t + 1, 2 - t
    return [((a * s - 5 * a) * s + 8 * a) * s - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * u - 5 * a) * u + 8 * a) * u - 4 * a]


@op("GridSample")
def _grid_sample(ctx: Context, node: NodeArgs) -> list[Value]:
    """Each output point is a weighted sum of gathered input points (1, 2**r or 4**r taps):
    coordinates are unnormalized, folded by the padding mode, then split into taps."""
    x, grid = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"),
                                                         node.attr("mode", "linear"))
    padding, align = node.attr("padding_mode", "zeros"), node.attr("align_corners", 0)
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    out_shape, rank = grid.shape[1:-1], len(sizes)
    points = grid.reshape(n, -1, rank)
    per_axis = []          # per spatial axis: [(index, weight, inside)] of its taps
    for axis, size in enumerate(sizes):
        g = points[..., rank - 1 - axis]        # the grid lists x (the last axis) first
        pos = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
        if mode == "nearest":
            pos = pos.round()
        low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            pos = pos.clip(0, size - 1)
        elif padding == "reflection":
            pos = _reflect(pos, low, high)
        if mode == "nearest":
            taps = [(pos.trunc(), None)]
        else:
            base = pos.floor()
            frac = pos - base
            weights = [1 - frac, frac] if mode == "linear" else _cubic(frac)
            first = 0 if mode == "linear" else -1
            taps = [(base + first + k, w) for k, w in enumerate(weights)]
        fetched = []
        for index, weight in taps:
            if padding == "reflection" and mode != "nearest":
                index = _reflect(index, low, high).trunc()
            inside = (index >= 0) & (index <= size - 1)
            index = index.clip(0, size - 1).cast("int32")
            fetched.append((index, weight, inside if padding == "zeros" else None))
        per_axis.append(fetched)
    flat = x.reshape(n, c, -1)
    total = None
    strides = [int(np.prod(sizes[a + 1:])) for a in range(rank)]
    for combo in np.ndindex(*(len(t) for t in per_axis)):
        index, weight, inside = None, None, None
        for axis, k in enumerate(combo):
            i, w, m = per_axis[axis][k]
            index = i * strides[axis] if index is None else index + i * strides[axis]
            weight = w if weight is None else (weight if w is None else weight * w)
            inside = m if inside is None else (inside if m is None else inside & m)
        taken = flat.gather(2, index.unsqueeze(1).expand(n, c, index.shape[1]))
        if weight is not None:
            taken = taken * weight.unsqueeze(1)
        if inside is not None:
            taken = inside.unsqueeze(1)._where(taken, 0.0).cast(x.dtype)
        total = taken if total is None else total + taken
    return [total.reshape(n, c, *out_shape)]


@op("Col2Im")
def _col2im(ctx: Context, node: NodeArgs) -> list[Value]:
    """Each block's column added into the image at its place: spread by the strides, shifted
    by the offset within the block, summed, and the padding cut off."""
    x = ctx.tensor(node.inputs[0])
    image, block = ctx.ints(node.inputs[1]), ctx.ints(node.inputs[2])
    rank = len(image)
    strides = node.attr("strides", [1] * rank)
    dilations = node.attr("dilations", [1] * rank)
    pads = node.attr("pads", [0] * 2 * rank)
    padded = [n + pads[i] + pads[rank + i] for i, n in enumerate(image)]
    counts = [(p - (d * (k - 1) + 1)) // s + 1
              for p, k, s, d in zip(padded, block, strides, dilations)]
    batch, channels = x.shape[0], x.shape[1] // int(np.prod(block))
    columns = x.reshape(batch, channels, -1, *counts)
    total = None
    for k, offset in enumerate(np.ndindex(*block)):
        part = columns[:, :, k]
        for axis in range(rank):
            part = spread(part, axis + 2, strides[axis])
        start = [o * d for o, d in zip(offset, dilations)]
        part = part.pad(((0, 0), (0, 0), *((b, p - b - n) for b, p, n in
                                           zip(start, padded, part.shape[2:]))))
        total = part if total is None else total + part
    return [total[(slice(None), slice(None), *(slice(pads[i], pads[i] + n)
                                               for i, n in enumerate(image)))]]


@op("Binarizer")
def _binarizer(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [(x > node.attr("threshold", 0.0)).cast(x.dtype)]


@op("ArrayFeatureExtractor")
def _array_feature_extractor(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    picked = x[..., ctx.tensor(node.inputs[1]).reshape(-1)]
    return [picked.reshape(1, -1) if x.ndim == 1 else picked]
