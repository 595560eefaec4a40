"""ONNX's signal and grid ops as Tensor operations (see ops.py for the conventions): DFT as
a product with cosine and sine matrices made on the host, and AffineGrid."""
from __future__ import annotations

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat

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
        return [out.unsqueeze(-1)]
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
    return [cat([out_real.unsqueeze(-1), out_imag.unsqueeze(-1)], -1)]


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
