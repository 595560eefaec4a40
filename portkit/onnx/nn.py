"""ONNX's neural-network ops: matrix products, convolution, pooling, normalization, softmax and
reductions, as Tensor operations (see ops.py for the conventions)."""
from __future__ import annotations

from math import ceil, prod

import numpy as np

from portkit.abi import dtypes
from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat
from portkit.tensor.spatial import unfolded_transpose

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b; half-precision products accumulate in float32, as the ONNX reference (numpy)
    and onnxruntime do, and are rounded once."""
    if a.dtype in (dtypes.float16, dtypes.bfloat16) and b.dtype == a.dtype:
        return (a.cast(dtypes.float32) @ b.cast(dtypes.float32)).cast(a.dtype)
    return a @ b


@op("MatMul")
def _matmul(ctx: Context, node: NodeArgs) -> list[Value]:
    return [matmul(ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]))]


@op("Gemm")
def _gemm(ctx: Context, node: NodeArgs) -> list[Value]:
    a, b = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    a = a.transpose(0, 1) if node.attr("transA", 0) else a
    b = b.transpose(0, 1) if node.attr("transB", 0) else b
    out = matmul(a, b)
    out = out * node.attr("alpha", 1.0) if node.attr("alpha", 1.0) != 1 else out
    if node.input(2) is not None:
        beta = node.attr("beta", 1.0)
        c = ctx.tensor(node.inputs[2])
        out = out + (c * beta if beta != 1 else c)
    return [out]


# -- convolution and pooling -----------------------------------------------------------------

def _spatial_pads(node: NodeArgs, size: tuple[int, ...], kernel: tuple[int, ...],
                  strides: tuple[int, ...], dilations: tuple[int, ...]) -> list[tuple[int, int]]:
    """(before, after) padding per spatial axis, from `pads` or `auto_pad`."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for n, k, s, d in zip(size, kernel, strides, dilations):
            total = max((ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small, large = total // 2, total - total // 2
            pads.append((small, large) if auto == "SAME_UPPER" else (large, small))
        return pads
    if auto == "VALID":
        return [(0, 0)] * len(size)
    flat = node.attr("pads", [0] * 2 * len(size))
    return list(zip(flat[:len(size)], flat[len(size):]))


def _as_2d(x: Tensor) -> Tensor:
    """(N, C, L) as (N, C, 1, L): 1-d work runs through the 2-d Tensor ops."""
    return x.unsqueeze(2) if x.ndim == 3 else x


def window(node: NodeArgs, x: Tensor, kernel: tuple[int, ...]):
    """A conv or pool node's strides, dilations and (before, after) pads per spatial axis."""
    spatial = x.ndim - 2
    strides = tuple(node.attr("strides", [1] * spatial))
    dilations = tuple(node.attr("dilations", [1] * spatial))
    pads = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
    if node.attr("ceil_mode", 0):
        pads = [(b, e + _ceil_extra(n, b, e, k, s, d))
                for (b, e), n, k, s, d in zip(pads, x.shape[2:], kernel, strides, dilations)]
    return strides, dilations, pads


def _ceil_extra(size: int, before: int, after: int, kernel: int, stride: int,
                dilation: int) -> int:
    """Padding to add at the end so a ceil-mode pool gets its last (partial) window; as in
    PyTorch, a window that would start inside the end padding is dropped."""
    span = (kernel - 1) * dilation + 1
    windows = -(-(size + before + after - span) // stride) + 1
    if (windows - 1) * stride >= size + before:
        windows -= 1
    return max((windows - 1) * stride + span - (size + before + after), 0)


def conv(x: Tensor, weight: Tensor, bias: Tensor | None, strides, dilations,
          groups: int) -> Tensor:
    """An unpadded 1-, 2- or 3-d convolution through the Tensor API's conv2d: 1-d as 2-d with
    a height of 1, 3-d as a sum over the kernel's depth of 2-d convolutions of depth slices.
    Half-precision inputs accumulate in float32, as the ONNX reference and onnxruntime do."""
    strides, dilations = tuple(strides), tuple(dilations)
    if x.dtype in (dtypes.float16, dtypes.bfloat16):
        wide = conv(x.cast(dtypes.float32), weight.cast(dtypes.float32),
                     None if bias is None else bias.cast(dtypes.float32), strides, dilations,
                     groups)
        return wide.cast(x.dtype)
    if x.ndim == 3:
        out = x.unsqueeze(2).conv2d(weight.unsqueeze(2), bias, stride=(1, *strides),
                                    dilation=(1, *dilations), groups=groups)
        return out.squeeze(2)
    if x.ndim == 4:
        return x.conv2d(weight, bias, stride=strides, dilation=dilations, groups=groups)
    n, c, depth = x.shape[:3]
    step, reach = strides[0], dilations[0]
    kernel = weight.shape[2]
    count = (depth - (kernel - 1) * reach - 1) // step + 1
    out = None
    for k in range(kernel):
        start = k * reach
        slab = x[:, :, start:start + (count - 1) * step + 1:step].transpose(1, 2)
        part = slab.reshape(n * count, c, *x.shape[3:]).conv2d(
            weight[:, :, k], None, stride=strides[1:], dilation=dilations[1:], groups=groups)
        out = part if out is None else out + part
    out = out.reshape(n, count, *out.shape[1:]).transpose(1, 2)
    return out if bias is None else out + bias.reshape(1, -1, 1, 1, 1)


@op("Conv")
def _conv_op(ctx: Context, node: NodeArgs) -> list[Value]:
    x, w = ctx.tensor(node.inputs[0]), node.inputs[1]
    # uploaded in one layout only: a constant is kept on the device in each it is asked for
    weight = (ctx.laid_out(w, (1, 2, 3, 0)) if len(w.shape) == 4 and node.attr("group", 1) == 1
              else ctx.tensor(w))
    bias = None if node.input(2) is None else ctx.tensor(node.inputs[2])
    strides, dilations, pads = window(node, x, weight.shape[2:])
    return [conv(x.pad(((0, 0), (0, 0), *pads)), weight, bias, strides, dilations,
                  node.attr("group", 1))]


@op("ConvTranspose")
def _conv_transpose(ctx: Context, node: NodeArgs) -> list[Value]:
    """A convolution of the input spread out by the strides (zeros between its elements) and
    padded by the kernel's reach, with the kernel flipped and its channel axes swapped."""
    x, weight = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    spatial, groups = x.ndim - 2, node.attr("group", 1)
    kernel = weight.shape[2:]
    strides = node.attr("strides", [1] * spatial)
    dilations = node.attr("dilations", [1] * spatial)
    extra = node.attr("output_padding", [0] * spatial)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (n - 1) + e + span for s, n, e, span in zip(strides, x.shape[2:], extra, spans)]
    wanted = node.attr("output_shape")
    if node.attr("pads") is None and node.attr("auto_pad", "NOTSET") in ("SAME_UPPER",
                                                                        "SAME_LOWER"):
        wanted = wanted or [n * s for n, s in zip(x.shape[2:], strides)]
        totals = [f - w for f, w in zip(full, wanted)]
        upper = node.attr("auto_pad") == "SAME_UPPER"
        pads = [(t // 2, t - t // 2) if upper else (t - t // 2, t // 2) for t in totals]
    else:
        flat = node.attr("pads", [0] * 2 * spatial)
        pads = list(zip(flat[:spatial], flat[spatial:]))
        if wanted is not None:      # the output is cut (or extended) at the end to this size
            pads = [(b, f - b - w) for (b, _), f, w in zip(pads, full, wanted)]
    bias = None if node.input(2) is None else ctx.tensor(node.inputs[2])
    if groups == 1 and list(kernel) == list(strides) and set(dilations) == {1}:
        y = unfolded_transpose(x, weight, [(-b, p - e) for (b, e), p in zip(pads, extra)])
        return [y if bias is None else y + bias.reshape(1, -1, *(1,) * spatial)]
    # zeros between the input's elements, then the kernel's reach less the padding
    for axis, s in enumerate(strides, start=2):
        if s > 1:
            x = x.unsqueeze(axis + 1).pad(((0, 0),) * (axis + 1) + ((0, s - 1),))
            x = x.reshape(*x.shape[:axis], x.shape[axis] * s, *x.shape[axis + 2:])
            x = x.pad(((0, 0),) * axis + ((0, 1 - s),))
    x = x.pad(((0, 0), (0, 0), *((span - 1 - b, span - 1 - e + p)
                                 for span, (b, e), p in zip(spans, pads, extra))))
    c_in, c_out = weight.shape[0], weight.shape[1] * groups
    weight = weight.reshape(groups, c_in // groups, c_out // groups, *kernel).transpose(1, 2)
    weight = weight.reshape(c_out, c_in // groups, *kernel).flip(tuple(range(2, 2 + spatial)))
    return [conv(x, weight, bias, [1] * spatial, dilations, groups)]


def _pool(x: Tensor, node: NodeArgs, fill: float, reduce: str) -> Tensor:
    kernel = tuple(node.attr("kernel_shape"))
    strides, dilations, pads = window(node, x, kernel)
    return _pool_nd(x.pad(((0, 0), (0, 0), *pads), fill), kernel, strides, dilations, reduce)


def _pool_nd(x: Tensor, kernel, strides, dilations, reduce: str) -> Tensor:
    """An unpadded 1-, 2- or 3-d pool through the Tensor API's 2-d pools (as conv does); a
    dilated average is a convolution of each channel with a uniform kernel."""
    if reduce == "avg" and any(d != 1 for d in dilations):
        channels = x.shape[1]
        weight = Tensor.full((channels, 1, *kernel), 1 / prod(kernel), dtype=x.dtype,
                             device=x.device)
        return conv(x, weight, None, strides, dilations, channels)
    if x.ndim == 3:
        return _pool_nd(x.unsqueeze(2), (1, *kernel), (1, *strides), (1, *dilations),
                        reduce).squeeze(2)
    if x.ndim == 4:
        if reduce == "max":
            return x.max_pool2d(kernel, strides, 0, dilations)
        return x.avg_pool2d(kernel, strides, 0)
    n, c, depth = x.shape[:3]
    count = (depth - (kernel[0] - 1) * dilations[0] - 1) // strides[0] + 1
    parts = []
    for k in range(kernel[0]):
        start = k * dilations[0]
        slab = x[:, :, start:start + (count - 1) * strides[0] + 1:strides[0]].transpose(1, 2)
        part = _pool_nd(slab.reshape(n * count, c, *x.shape[3:]), kernel[1:], strides[1:],
                        dilations[1:], reduce)
        parts.append(part.reshape(n, count, c, *part.shape[2:]).transpose(1, 2))
    out = parts[0]
    for part in parts[1:]:
        out = out.maximum(part) if reduce == "max" else out + part
    return out if reduce == "max" else out / kernel[0]


@op("MaxPool")
def _max_pool(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    if node.outputs == 1:
        return [_pool(x, node, float("-inf"), "max")]
    # With the Indices output: each window's elements stacked on a new first axis, the first
    # largest one taken, and its place in the input counted in x's flat (N, C, H, W) order.
    kernel = tuple(node.attr("kernel_shape"))
    strides, dilations, pads = window(node, x, kernel)
    padded = x.pad(((0, 0), (0, 0), *pads), float("-inf"))
    counts = [(n - (k - 1) * d - 1) // s + 1
              for n, k, s, d in zip(padded.shape[2:], kernel, strides, dilations)]
    offsets = list(np.ndindex(*kernel))
    stacked = cat([padded[(slice(None), slice(None), *(
        slice(o * d, o * d + (c - 1) * s + 1, s)
        for o, d, c, s in zip(offset, dilations, counts, strides)))].unsqueeze(0)
        for offset in offsets], 0)
    chosen = stacked.argmax(0)
    (height, width), (rows, cols) = x.shape[2:], counts
    row = Tensor.arange(rows, device=x.device).reshape(rows, 1) * strides[0] - pads[0][0]
    col = Tensor.arange(cols, device=x.device).reshape(1, cols) * strides[1] - pads[1][0]
    row = row + (chosen // kernel[1]) * dilations[0]
    col = col + (chosen % kernel[1]) * dilations[1]
    plane = Tensor.arange(x.shape[0] * x.shape[1], device=x.device).reshape(
        x.shape[0], x.shape[1], 1, 1) * (height * width)
    place = row * width + col if not node.attr("storage_order", 0) else row + col * height
    return [stacked.amax(0), place + plane]


@op("MaxUnpool")
def _max_unpool(ctx: Context, node: NodeArgs) -> list[Value]:
    """Zeros with each value written at its index (MaxPool's flat Indices output)."""
    x, indices = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    kernel, spatial = node.attr("kernel_shape"), x.ndim - 2
    strides = node.attr("strides", [1] * spatial)
    pads = node.attr("pads", [0] * 2 * spatial)
    shape = [*x.shape[:2], *((n - 1) * s - pads[i] - pads[i + spatial] + k
                             for i, (n, k, s) in enumerate(zip(x.shape[2:], kernel, strides)))]
    zeros = Tensor.zeros(prod(shape), dtype=x.dtype, device=x.device)
    out = zeros.scatter(0, indices.reshape(-1), x.reshape(-1)).reshape(*shape)
    if node.input(2) is None:
        return [out]
    # as the ONNX reference: indices count in the inferred shape, padded at the end to this one
    wanted = ctx.ints(node.inputs[2])
    return [out.pad(tuple((0, w - n) for w, n in zip(wanted, shape)))]


@op("AveragePool")
def _average_pool(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    total = _pool(x, node, 0.0, "avg")
    include_pad, ceil_mode = node.attr("count_include_pad", 0), node.attr("ceil_mode", 0)
    if include_pad and not ceil_mode or not any(node.attr("pads", [])) and node.attr(
            "auto_pad", "NOTSET") in ("NOTSET", "VALID") and not ceil_mode:
        return [total]
    # Divide by the share of each window that counts: the real elements, and the padding too
    # under count_include_pad, but never what ceil mode adds past the padding.
    ones = Tensor.ones(*x.shape, dtype=x.dtype, device=x.device)
    if include_pad:
        kernel = tuple(node.attr("kernel_shape"))
        strides, dilations, pads = window(node, x, kernel)
        given = _spatial_pads(node, x.shape[2:], kernel, strides, dilations)
        ones = ones.pad(((0, 0), (0, 0), *given), 1.0).pad(
            ((0, 0), (0, 0), *((0, e - g) for (_, e), (_, g) in zip(pads, given))))
        return [total / _pool_nd(ones, kernel, strides, dilations, "avg")]
    return [total / _pool(ones, node, 0.0, "avg")]


@op("LpPool")
def _lp_pool(ctx: Context, node: NodeArgs) -> list[Value]:
    x, p = ctx.tensor(node.inputs[0]), node.attr("p", 2)
    windows = prod(node.attr("kernel_shape"))
    powered = x.abs() if p == 1 else x.abs().pow(p)
    total = _pool(powered, node, 0.0, "avg") * windows
    return [total if p == 1 else total.pow(1 / p)]


@op("GlobalAveragePool")
def _global_average_pool(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [x.mean(tuple(range(2, x.ndim)), keepdim=True)]


@op("GlobalMaxPool")
def _global_max_pool(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [x.amax(tuple(range(2, x.ndim)), keepdim=True)]


CHECKS.update(
    Conv=lambda a, n: len(a.get("kernel_shape", [0, 0])) > 3 and "4-d and larger",
    ConvTranspose=lambda a, n: len(a.get("kernel_shape", [0, 0])) > 3 and "4-d and larger",
    MaxPool=lambda a, n: (len(a["kernel_shape"]) > 3 and "4-d and larger") or (
        n > 1 and len(a["kernel_shape"]) != 2 and "the Indices output of a 1-d or 3-d pool"),
    AveragePool=lambda a, n: len(a["kernel_shape"]) > 3 and "4-d and larger",
    LpPool=lambda a, n: len(a["kernel_shape"]) > 3 and "4-d and larger",
)


# -- normalization -----------------------------------------------------------------------------

def _channel(t: Tensor, ndim: int) -> Tensor:
    return t.reshape(1, -1, *([1] * (ndim - 2)))


@op("BatchNormalization")
def _batch_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale, bias, mean, var = (ctx.tensor(v) for v in node.inputs[:5])
    epsilon = node.attr("epsilon", 1e-5)
    if not node.attr("training_mode", 0):
        return [x.batchnorm(scale, bias, mean, (var + epsilon).rsqrt())]
    axes = (0, *range(2, x.ndim))      # training: the batch's own statistics, and running ones
    batch_mean, batch_var = x.mean(axes), x.var(axes, correction=0)
    momentum = node.attr("momentum", 0.9)
    return [x.batchnorm(scale, bias, batch_mean, (batch_var + epsilon).rsqrt()),
            mean * momentum + batch_mean * (1 - momentum),
            var * momentum + batch_var * (1 - momentum)][:node.outputs]


@op("InstanceNormalization")
def _instance_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale, bias = (ctx.tensor(v) for v in node.inputs)
    axes = tuple(range(2, x.ndim))
    normed = x.layernorm(axes, node.attr("epsilon", 1e-5))
    return [normed * _channel(scale, x.ndim) + _channel(bias, x.ndim)]


@op("LayerNormalization")
def _layer_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    axis = node.attr("axis", -1) % x.ndim
    axes, epsilon = tuple(range(axis, x.ndim)), node.attr("epsilon", 1e-5)
    out = x.layernorm(axes, epsilon) * scale
    out = out if node.input(2) is None else out + ctx.tensor(node.inputs[2])
    mean = x.mean(axes, keepdim=True)
    invstd = (((x - mean) * (x - mean)).mean(axes, keepdim=True) + epsilon).rsqrt()
    return [out, mean, invstd][:node.outputs]


@op("RMSNormalization")
def _rms_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    axis = node.attr("axis", -1) % x.ndim
    mean_square = (x * x).mean(tuple(range(axis, x.ndim)), keepdim=True)
    return [x * (mean_square + node.attr("epsilon", 1e-5)).rsqrt() * scale]


@op("GroupNormalization")
def _group_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale, bias = (ctx.tensor(v) for v in node.inputs)
    groups = node.attr("num_groups")
    grouped = x.reshape(x.shape[0], groups, -1).layernorm(-1, node.attr("epsilon", 1e-5))
    return [grouped.reshape(*x.shape) * _channel(scale, x.ndim) + _channel(bias, x.ndim)]


@op("MeanVarianceNormalization")
def _mvn(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [x.layernorm(tuple(node.attr("axes", [0, 2, 3])), 1e-9)]


@op("LpNormalization")
def _lp_norm(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axis, p = node.attr("axis", -1), node.attr("p", 2)
    norm = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return [(norm == 0)._where(0.0, x / norm).cast(x.dtype)]    # a zero vector stays zero


CHECKS["LpNormalization"] = lambda a, n: a.get("p", 2) not in (1, 2) and f"p={a['p']}"
CHECKS["LayerNormalization"] = lambda a, n: a.get("stash_type", 1) != 1 and "stash_type"


def _softmax(log: bool) -> Op:
    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        x = ctx.tensor(node.inputs[0])
        if ctx.opset >= 13:
            axis = node.attr("axis", -1)
            return [x.log_softmax(axis) if log else x.softmax(axis)]
        axis = node.attr("axis", 1) % max(x.ndim, 1)   # before 13: over all axes from `axis`
        flat = x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))
        return [(flat.log_softmax(-1) if log else flat.softmax(-1)).reshape(*x.shape)]
    return run


OPS.update(Softmax=_softmax(log=False), LogSoftmax=_softmax(log=True))


# -- reductions --------------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": lambda x, a, k: x.sum(a, keepdim=k),
    "ReduceMean": lambda x, a, k: x.mean(a, keepdim=k),
    "ReduceMax": lambda x, a, k: x.amax(a, keepdim=k),
    "ReduceMin": lambda x, a, k: x.amin(a, keepdim=k),
    "ReduceProd": lambda x, a, k: x.prod(a, keepdim=k),
    "ReduceSumSquare": lambda x, a, k: (x * x).sum(a, keepdim=k),
    "ReduceL1": lambda x, a, k: x.abs().sum(a, keepdim=k),
    "ReduceL2": lambda x, a, k: (x * x).sum(a, keepdim=k).sqrt(),
    "ReduceLogSum": lambda x, a, k: x.sum(a, keepdim=k).log(),
    "ReduceLogSumExp": lambda x, a, k: x.logsumexp(a, keepdim=k),
}


# What ONNX says a reduce over no elements gives, where the Tensor API has no answer.
_EMPTY = {
    "ReduceMax": lambda d: -float("inf") if d.is_float else d.min,
    "ReduceMin": lambda d: float("inf") if d.is_float else d.max,
    "ReduceLogSumExp": lambda d: -float("inf"),
    "ReduceLogSum": lambda d: -float("inf"),
}


def _reduce(name: str) -> Op:
    since = 13 if name == "ReduceSum" else 18     # when `axes` became an input

    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        x = ctx.tensor(node.inputs[0])
        axes = node.input(1) if ctx.opset >= since else node.attr("axes")
        axes = [] if axes is None else ctx.ints(axes)
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        keep, axes = bool(node.attr("keepdims", 1)), tuple(a % x.ndim for a in axes)
        if prod(x.shape[a] for a in axes) == 0 and name in _EMPTY:
            shape = [1 if i in axes else s for i, s in enumerate(x.shape) if keep or i not in axes]
            return [Tensor.full(tuple(shape), _EMPTY[name](x.dtype), dtype=x.dtype,
                                device=x.device)]
        return [_REDUCE[name](x, axes, keep)]
    return run


OPS.update({name: _reduce(name) for name in _REDUCE})


def _arg(method) -> Op:
    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        x = ctx.tensor(node.inputs[0])
        axis, keep = node.attr("axis", 0) % x.ndim, bool(node.attr("keepdims", 1))
        if not node.attr("select_last_index", 0):
            return [method(x, axis, keepdim=keep)]
        # The last of equal values: the first one along the flipped axis, counted back.
        return [(x.shape[axis] - 1) - method(x.flip(axis), axis, keepdim=keep)]
    return run


OPS.update(ArgMax=_arg(Tensor.argmax), ArgMin=_arg(Tensor.argmin))


# -- rearrangements ----------------------------------------------------------------------------

@op("Trilu")
def _trilu(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    k = ctx.ints(node.inputs[1])[0] if node.input(1) is not None else 0
    rows, cols = x.shape[-2:]
    row = Tensor.arange(rows, device=x.device).reshape(rows, 1)
    col = Tensor.arange(cols, device=x.device).reshape(1, cols)
    keep = (col - row >= k) if node.attr("upper", 1) else (col - row <= k)
    return [keep._where(x, Tensor.zeros(1, dtype=x.dtype, device=x.device))]


@op("Hardmax")
def _hardmax(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axis = node.attr("axis", -1) % x.ndim
    if ctx.opset < 13:      # before 13: over the flattened axes from `axis`, as Softmax
        flat = x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))
        return [_hardmax_last(flat).reshape(*x.shape)]
    moved = x.transpose(axis, -1)
    return [_hardmax_last(moved).transpose(axis, -1)]


def _hardmax_last(x: Tensor) -> Tensor:
    return x.argmax(-1).one_hot(x.shape[-1]).cast(x.dtype)


@op("EyeLike")
def _eye_like(ctx: Context, node: NodeArgs) -> list[Value]:
    import onnx

    x = ctx.tensor(node.inputs[0])
    rows, cols = x.shape
    row = Tensor.arange(rows, device=x.device).reshape(rows, 1)
    col = Tensor.arange(cols, device=x.device).reshape(1, cols)
    dtype = x.dtype if node.attr("dtype") is None else dtypes.from_numpy(
        onnx.helper.tensor_dtype_to_np_dtype(node.attr("dtype")))
    return [(col - row == node.attr("k", 0)).cast(dtype)]


@op("OneHot")
def _one_hot(ctx: Context, node: NodeArgs) -> list[Value]:
    indices, depth = ctx.tensor(node.inputs[0]), int(ctx.host(node.inputs[1]).item())
    off, on = (v.item() for v in ctx.host(node.inputs[2]).reshape(2))
    values_dtype = np.asarray(ctx.host(node.inputs[2])).dtype
    indices = (indices < 0)._where(indices + depth, indices)
    hot = indices.one_hot(depth).cast(dtypes.bool_)
    out = hot._where(on, off).cast(dtypes.from_numpy(values_dtype)
                                  if values_dtype.itemsize < 8 else dtypes.float32)
    axis = node.attr("axis", -1) % out.ndim
    return [out.permute(*range(axis), out.ndim - 1, *range(axis, out.ndim - 1))]


@op("DepthToSpace")
def _depth_to_space(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    b, (n, c, h, w) = node.attr("blocksize"), x.shape
    if node.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


@op("SpaceToDepth")
def _space_to_depth(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    b, (n, c, h, w) = node.attr("blocksize"), x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else y.permute(
        0, 1, 3, 5, 2, 4)
    return [y.reshape(n, c * b * b, h // b, w // b)]


# -- losses ------------------------------------------------------------------------------------

def _nll(ctx: Context, node: NodeArgs, log_prob: Tensor, target: Tensor,
         weight: Value) -> Tensor:
    """NegativeLogLikelihoodLoss of log-probabilities (N, C, ...) at integer targets (N, ...)."""
    ignore = node.attr("ignore_index")
    ignored = None if ignore is None else target == ignore
    if ignored is not None:       # an ignored target may be no class at all: read class 0
        target = ignored._where(0, target).cast(target.dtype)
    picked = -log_prob.gather(1, target.unsqueeze(1)).squeeze(1)
    weights = None if weight is None else ctx.tensor(weight)[target.reshape(-1)].reshape(
        *target.shape)
    if ignored is not None:
        zero = Tensor.zeros(1, dtype=log_prob.dtype, device=log_prob.device)
        weights = ignored._where(zero, 1.0 if weights is None else weights).cast(log_prob.dtype)
    loss = picked if weights is None else picked * weights
    reduction = node.attr("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean() if weights is None else loss.sum() / weights.sum()


@op("NegativeLogLikelihoodLoss")
def _nll_loss(ctx: Context, node: NodeArgs) -> list[Value]:
    return [_nll(ctx, node, ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]),
                 node.input(2))]


@op("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx: Context, node: NodeArgs) -> list[Value]:
    log_prob = ctx.tensor(node.inputs[0]).log_softmax(1)
    loss = _nll(ctx, node, log_prob, ctx.tensor(node.inputs[1]), node.input(2))
    return [loss, log_prob][:node.outputs]


@op("LRN")
def _lrn(ctx: Context, node: NodeArgs) -> list[Value]:
    x, size = ctx.tensor(node.inputs[0]), node.attr("size")
    square = (x * x).pad(((0, 0), ((size - 1) // 2, size // 2)) + ((0, 0),) * (x.ndim - 2))
    channels = x.shape[1]
    total = square[:, :channels]
    for shift in range(1, size):      # the sum over each channel's window of neighbours
        total = total + square[:, shift:shift + channels]
    scale = total * (node.attr("alpha", 1e-4) / size) + node.attr("bias", 1.0)
    return [x / scale.pow(node.attr("beta", 0.75))]
