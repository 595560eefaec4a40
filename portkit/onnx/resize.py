"""ONNX's Resize (and the older Upsample) as Tensor operations (see ops.py for the conventions).

Resizing is separable and linear: along each axis every output element is a fixed weighted sum
of input elements. The weights depend on shapes and attributes only, so they are computed here
on the host, once per axis (following the ONNX reference's arithmetic: source coordinate, nearest
neighbours, then coefficients), and the device does one matrix product per resized axis, or a
gather where every output copies one input (nearest mode).
"""
from __future__ import annotations

from math import floor

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _source(mode: str, size: int, scale: float, out: int, roi: tuple[float, float]
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """The input coordinate of each output position, and which positions fall outside the
    input (tf_crop_and_resize only)."""
    y = np.arange(out, dtype=np.float64)
    width = scale * size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi
        x = np.full(out, (end - start) * (size - 1) / 2) if width == 1 else \
            y * (end - start) * (size - 1) / (width - 1)
        x = x + start * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:       # tf_half_pixel_for_nn
        x = (y + 0.5) / scale
    return x, outside


def _coefficients(node: NodeArgs, mode: str, antialias: bool, ratio: float, scale: float
                  ) -> np.ndarray:
    """The weights of the window's neighbours for a source coordinate `ratio` past a pixel."""
    a = node.attr("cubic_coeff_a", -0.75)
    if mode == "nearest":
        if ratio == int(ratio):
            return np.array([0.0, 1.0])
        rule = node.attr("nearest_mode", "round_prefer_floor")
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": False, "ceil": True}[rule]
        return np.array([0.0, 1.0] if up else [1.0, 0.0])
    if not antialias:
        if mode == "linear":
            return np.array([1 - ratio, ratio])
        r, s = ratio + 1, 2 - ratio
        return np.array([((a * r - 5 * a) * r + 8 * a) * r - 4 * a,
                         ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                         ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) ** 2 + 1,
                         ((a * s - 5 * a) * s + 8 * a) * s - 4 * a])
    scale = min(scale, 1.0)        # antialiasing widens the kernel when shrinking
    reach = 1 if mode == "linear" else 2
    start = floor(-reach / scale) + 1
    args = np.abs((np.arange(start, 2 - start) - ratio) * scale)
    if mode == "linear":
        weights = np.clip(1 - args, 0, 1)
    else:
        weights = np.where(args <= 1, (a + 2) * args ** 3 - (a + 3) * args ** 2 + 1,
                           np.where(args < 2, a * args ** 3 - 5 * a * args ** 2 + 8 * a * args
                                    - 4 * a, 0.0))
    return weights / weights.sum()


def _weights(node: NodeArgs, mode: str, size: int, scale: float, out: int,
             roi: tuple[float, float], transform: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(out, size) weights of one axis, and the positions that take the extrapolation value."""
    antialias = bool(node.attr("antialias", 0)) and mode != "nearest"
    x, outside = _source(transform, size, scale, out, roi)
    base = np.floor(x).astype(np.int64)
    ratios = np.where(x == base, 1.0, x - base)
    coeffs = np.stack([_coefficients(node, mode, antialias, float(r), scale) for r in ratios])
    n = coeffs.shape[1]
    # the n input positions nearest to x (ties to the smaller), in edge-padded coordinates
    pad = -(-n // 2)
    padded = x + pad
    whole = np.floor(padded).astype(np.int64)
    frac = padded - whole
    if n % 2 == 0:
        first = whole + np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        first = whole + np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    neighbours = first[:, None] + np.arange(n)[None, :] - pad
    if node.attr("exclude_outside", 0):
        coeffs = np.where((neighbours < 0) | (neighbours >= size), 0.0, coeffs)
        total = coeffs.sum(-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    weights = np.zeros((out, size))
    rows = np.repeat(np.arange(out), n)
    np.add.at(weights, (rows, np.clip(neighbours, 0, size - 1).reshape(-1)), coeffs.reshape(-1))
    return weights, outside


def _plan(ctx: Context, node: NodeArgs, shape: tuple[int, ...]
          ) -> tuple[list[float], list[int], list[float] | None]:
    """(scale, output size) per axis, and the region of interest (start..., end...)."""
    rank = len(shape)
    if ctx.opset >= 11:
        raw = node.input(2)
    else:       # Upsample-9 and Resize-10 take scales second; Upsample-7 as an attribute
        raw = node.attr("scales") if node.input(1) is None else node.input(1)
    raw = None if raw is None else ctx.host(raw).astype(np.float64)
    scales_given = raw is not None and raw.size > 0
    axes = list(node.attr("axes", range(rank)))
    axes = [a % rank for a in axes]
    roi = node.input(1) if ctx.opset >= 11 else None
    roi = None if roi is None or ctx.host(roi).size == 0 else list(ctx.host(roi).astype(float))
    if roi is not None and len(axes) < rank:
        full = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full[a], full[rank + a] = roi[i], roi[len(axes) + i]
        roi = full
    if scales_given:
        scales = [1.0] * rank
        for a, s in zip(axes, raw.reshape(-1)):
            scales[a] = float(s)
        return scales, [int(s * n) for s, n in zip(scales, shape)], roi
    sizes = list(shape)
    for a, s in zip(axes, ctx.ints(node.inputs[3])):
        sizes[a] = s
    scales = [s / n for s, n in zip(sizes, shape)]
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy != "stretch":
        chosen = (min if policy == "not_larger" else max)(scales[a] for a in axes)
        scales = [chosen if i in axes else 1.0 for i in range(rank)]
        sizes = [int(chosen * n + 0.5) if i in axes else n for i, n in enumerate(shape)]
    return scales, sizes, roi


@op("Resize", "Upsample")
def _resize(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    mode = node.attr("mode", "nearest")
    mode = "linear" if mode in ("bilinear", "trilinear") else mode
    legacy = ctx.opset < 11      # Upsample and Resize-10: asymmetric, nearest rounds down
    transform = "asymmetric" if legacy else node.attr(
        "coordinate_transformation_mode", "half_pixel")
    if legacy:
        node = NodeArgs({**node.attrs, "nearest_mode": "floor"}, node.inputs, node.outputs)
    scales, sizes, roi = _plan(ctx, node, x.shape)
    extrapolation = node.attr("extrapolation_value", 0.0)
    out = x
    for axis, (size, scale, count) in enumerate(zip(x.shape, scales, sizes)):
        span = (0.0, 1.0) if roi is None else (roi[axis], roi[axis + x.ndim])
        if count == size and np.isclose(scale, 1.0) and np.allclose(span, (0.0, 1.0)):
            continue
        weights, outside = _weights(node, mode, size, scale, count, span, transform)
        out = _apply(ctx, out, axis, weights)
        if outside is not None and outside.any():
            shape = [1] * x.ndim
            shape[axis] = count
            out = ctx.tensor(outside.reshape(shape))._where(extrapolation, out).cast(x.dtype)
    return [out]


def _apply(ctx: Context, x: Tensor, axis: int, weights: np.ndarray) -> Tensor:
    """x with `axis` mapped through the (out, size) weights."""
    if ((weights == 0) | (weights == 1)).all() and (weights.sum(1) == 1).all():
        return x[(slice(None),) * axis + (ctx.tensor(weights.argmax(1).astype(np.int32)),)]
    moved = x.transpose(axis, -1)
    mixed = moved.cast(x.dtype if x.dtype.is_float else "float32") @ ctx.tensor(
        weights.T.astype(np.dtype(x.dtype.np) if x.dtype.is_float else np.float32))
    if not x.dtype.is_float:
        mixed = mixed.round().clip(x.dtype.min, x.dtype.max).cast(x.dtype)
    return mixed.transpose(axis, -1)
