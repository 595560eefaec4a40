"""ONNX's linear quantization as Tensor operations (see ops.py for the conventions):
QuantizeLinear, DequantizeLinear, MatMulInteger and QLinearMatMul, for the integer types.
Rounding is to the nearest even, then the result saturates, as the ONNX reference does."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from portkit.abi import dtypes
from portkit.onnx.nn import window
from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _broadcast(value: Tensor, shape: tuple[int, ...], axis: int, block: int) -> Tensor:
    """A scale or zero point made broadcastable to `shape`: a scalar as is, a vector along
    `axis`, blocks repeated `block` times along `axis` (the last one cut short)."""
    if value.ndim == 0 or value.numel() == 1:
        return value.reshape(())
    if not block:
        dims = [1] * len(shape)
        dims[axis] = value.numel()
        return value.reshape(*dims)
    value = value.repeat_interleave(block, axis)
    return value[(slice(None),) * axis + (slice(0, shape[axis]),)]


# float32's v + M - M is v rounded to an integer, ties to even, where |v| <= 2^22: the sum's
# unit in the last place is 1. Ten ops fewer than round()'s floor and tie test, it ran a
# QuantizeLinear of 1x64x58x58 at 1.9x the speed (one thread).
_ROUNDING = 1.5 * 2 ** 23


def _rounded(x: Tensor, dtype) -> Tensor:
    """x rounded to the nearest integer (ties to even); where x is float32 and `dtype` an
    integer of at most 16 bits, first clipped to +-(its range's size), which keeps what
    any zero point of `dtype` added after saturates to."""
    if x.dtype != dtypes.float32 or not dtype.is_int or dtype.bits > 16:
        return x.round()
    span = float(dtype.max - dtype.min + 1)
    return (x.clip(-span, span) + _ROUNDING) - _ROUNDING


def _saturated(x: Tensor, dtype) -> Tensor:
    """x rounded to the nearest integer (ties to even) and clipped to `dtype`'s range."""
    return _rounded(x, dtype).clip(dtype.min, dtype.max).cast(dtype)


def _zero_point(ctx: Context, node: NodeArgs, index: int, shape, axis: int, block: int):
    value = node.input(index)
    return None if value is None else _broadcast(ctx.tensor(value), shape, axis, block)


def _onnx_dtype(code: int):
    import onnx

    return dtypes.from_numpy(onnx.helper.tensor_dtype_to_np_dtype(code))


def _operands(ctx: Context, node: NodeArgs) -> tuple[Tensor, Tensor, Tensor | None]:
    """x, and the scale and zero point (None when absent) broadcastable to x along `axis`,
    per block of `block_size` when it is set: Quantize- and DequantizeLinear's inputs."""
    x = ctx.tensor(node.inputs[0])
    axis, block = node.attr("axis", 1) % max(x.ndim, 1), node.attr("block_size", 0)
    scale = _broadcast(ctx.tensor(node.inputs[1]), x.shape, axis, block)
    return x, scale, _zero_point(ctx, node, 2, x.shape, axis, block)


@op("QuantizeLinear")
def _quantize(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale, zero = _operands(ctx, node)
    target = zero.dtype if zero is not None else (
        _onnx_dtype(node.attr("output_dtype")) if node.attr("output_dtype") else dtypes.uint8)
    scaled = _rounded(x / scale, target)
    if zero is not None:
        scaled = scaled + zero.cast(scaled.dtype)
    return [scaled.clip(target.min, target.max).cast(target)]


@op("DequantizeLinear")
def _dequantize(ctx: Context, node: NodeArgs) -> list[Value]:
    x, scale, zero = _operands(ctx, node)
    wide = x.cast(dtypes.float32)
    if zero is not None:
        wide = wide - zero.cast(dtypes.float32)
    target = _onnx_dtype(node.attr("output_dtype")) if node.attr("output_dtype") else scale.dtype
    return [(wide * scale.cast(dtypes.float32)).cast(target)]


def _centred(ctx: Context, value: Value, zero: Value) -> Tensor:
    """An integer tensor less its zero point, in int32."""
    out = ctx.tensor(value).cast(dtypes.int32)
    return out if zero is None else out - ctx.tensor(zero).cast(dtypes.int32)


@op("MatMulInteger")
def _matmul_integer(ctx: Context, node: NodeArgs) -> list[Value]:
    a = _centred(ctx, node.inputs[0], node.input(2))
    b = _centred(ctx, node.inputs[1], node.input(3))
    return [a @ b]


@op("QLinearMatMul")
def _qlinear_matmul(ctx: Context, node: NodeArgs) -> list[Value]:
    a = _centred(ctx, node.inputs[0], node.input(2))
    b = _centred(ctx, node.inputs[3], node.input(5))
    scales = [ctx.host(node.inputs[i]).astype(np.float64) for i in (1, 4, 6)]
    factor = scales[0] * scales[1] / scales[2]
    product = (a @ b).cast(dtypes.float32) * ctx.tensor(factor.astype(np.float32))
    zero = node.input(7)
    target = ctx.tensor(node.inputs[0]).dtype if zero is None else ctx.tensor(zero).dtype
    if zero is not None:
        product = product + ctx.tensor(zero).cast(dtypes.float32)
    return [_saturated(product, target)]


# -- QDQ convolutions in integers --------------------------------------------------------------
#
# A model quantized in the QDQ format (onnxruntime.quantization.quantize_static) keeps its
# Conv in float between DequantizeLinear nodes: DQ(x_q) and DQ(w_q) (per output channel)
# feeding Conv, a QuantizeLinear after it. Run so, the weights are dequantized once at load
# and the conv is a float one. `fused` rewrites such a Conv (and MatMul and Gemm) to read
# x_q and w_q themselves (int8 activations shifted to uint8 by 128, `_unsigned`):
# the integer conv sums (x_q - zx) * w_q exactly in int32, on a matrix unit where the device
# has one for uint8 x int8 (pack.py), and one multiply-add per output scales it back to
# float, acc * sx * sw[c] + bias, which the QuantizeLinear after it fuses into (its round and
# saturation exactly ONNX's). What the sum adds up to is the float conv's value up to float
# rounding: the float path rounds every product and partial sum, the integer one only the
# final scaling, as onnxruntime's QLinearConv does.

INTEGER_CONV = "portkit.IntegerConv"      # no ONNX op has a dotted name
INTEGER_MATMUL = "portkit.IntegerMatMul"


def fused(nodes: list, constants: dict[str, np.ndarray]) -> list:
    """`nodes` with each 2-d Conv (group 1), MatMul and Gemm (alpha and beta 1, A not
    transposed) whose input is DequantizeLinear of a uint8 or int8 tensor (scalar scale and
    zero point) and whose weight is DequantizeLinear of a constant int8 tensor with zero points 0
    (scale per tensor or per output channel), rewritten to INTEGER_CONV or INTEGER_MATMUL on
    (x_q, sx, zx, w_q, sw, bias); every other node as it is."""
    made = {out: node for node in nodes for out in node.outputs}

    def dequantized(name: str):
        node = made.get(name)
        if node is None or node.op != "DequantizeLinear" or len(node.inputs) < 3 or any(
                node.attrs.get(a) for a in ("block_size", "output_dtype")):
            return None
        scale, zero = (constants.get(n) for n in node.inputs[1:3])
        if scale is None or zero is None or scale.dtype != np.float32:
            return None
        return node
    def output_axis(node) -> int | None:
        """The weight's output-channel axis where `node` is a Conv, MatMul or Gemm this
        rewrites (one ordinary product: no groups, no transposed A, no alpha or beta)."""
        if node.op == "Conv":
            return 0 if node.attrs.get("group", 1) == 1 else None
        if node.op == "MatMul":
            return 1
        plain = all(node.attrs.get(a, d) == d for a, d in (
            ("transA", 0), ("alpha", 1.0), ("beta", 1.0)))
        return (0 if node.attrs.get("transB", 0) else 1) if node.op == "Gemm" and plain else None
    out = []
    for node in nodes:
        axis = output_axis(node) if len(node.inputs) > 1 else None
        x = None if axis is None else dequantized(node.inputs[0])
        w = x and dequantized(node.inputs[1])
        if axis is None or x is None or w is None:
            out.append(node)
            continue
        sx, zx = (constants[n] for n in x.inputs[1:3])
        w_q = constants.get(w.inputs[0], np.zeros(0))
        sw, zw = (constants[n] for n in w.inputs[1:3])
        if (x.inputs[0] in constants or zx.dtype not in (np.uint8, np.int8) or sx.size != 1
                or w_q.dtype != np.int8 or w_q.ndim != (4 if node.op == "Conv" else 2)
                or zw.any() or sw.size not in (1, w_q.shape[axis])
                or (sw.size > 1 and w.attrs.get("axis", 1) % w_q.ndim != axis)):
            out.append(node)
            continue
        bias = node.inputs[2:3]
        out.append(replace(node, op=INTEGER_CONV if node.op == "Conv" else INTEGER_MATMUL,
                           inputs=(x.inputs[0], *x.inputs[1:3], *w.inputs[:2], *bias)))
    return out


def _unsigned(ctx: Context, node: NodeArgs) -> tuple[Tensor, float, int]:
    """x_q as uint8, the matrix unit's A dtype, with its scale and zero point: int8 values
    (int8 activations) plus 128, whose zero point is then 128 more."""
    x = ctx.tensor(node.inputs[0])
    sx, zx = (ctx.host(v).reshape(-1)[0] for v in node.inputs[1:3])
    if x.dtype == dtypes.int8:
        return (x.cast(dtypes.int16) + 128).cast(dtypes.uint8), float(sx), int(zx) + 128
    return x, float(sx), int(zx)


def _integer_weights(ctx: Context, node: NodeArgs, x: Tensor, sx: float, zx: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """The conv's int8 weight on the device, laid out [cin][kh][kw][cout] (as the float conv's,
    nn.py) with input channels added as zeros up to a multiple of 4 (the matrix unit's k
    terms are 4 channels at one tap); and per output channel, as float32 (1, cout, 1, 1), the
    scale sx * sw and the bias less zx times the scaled sum of the channel's weights (the
    zero point's share of the sum, taken out after it). Uploaded once per model constant."""
    w_q = node.inputs[3]
    # uploaded beside the model's constants, under keys no axis order takes (negative)
    keys = [(id(w_q), (-1, x.shape[1], i)) for i in range(3)]
    if keys[0] not in ctx.uploaded:
        w = np.asarray(w_q)
        cout = w.shape[0]
        scale = (np.float64(sx) * ctx.host(node.inputs[4]).astype(np.float64)).reshape(-1)
        scale = np.broadcast_to(scale, (cout,))
        sums = w.astype(np.int64).sum(axis=(1, 2, 3))
        bias = np.zeros(cout) if node.input(5) is None else ctx.host(node.inputs[5]).astype(
            np.float64)
        bias = bias - zx * sums * scale
        extra = -w.shape[1] % 4
        w = np.pad(w, ((0, 0), (0, extra), (0, 0), (0, 0)))
        weight = Tensor(np.ascontiguousarray(w.transpose(1, 2, 3, 0)),
                        device=ctx.device).permute(3, 0, 1, 2)
        shaped = [Tensor(v.astype(np.float32).reshape(1, cout, 1, 1), device=ctx.device)
                  for v in (scale, bias)]
        ctx.uploaded.update(zip(keys, (weight, *shaped)))
    return ctx.uploaded[keys[0]], ctx.uploaded[keys[1]], ctx.uploaded[keys[2]]


def _integer_conv(ctx: Context, node: NodeArgs) -> list[Value]:
    """INTEGER_CONV: Conv's float output from x_q and w_q, summed in int32 (`fused`)."""
    x, sx, zx = _unsigned(ctx, node)
    weight, scale, bias = _integer_weights(ctx, node, x, sx, zx)
    strides, dilations, pads = window(node, x, weight.shape[2:])
    # padded with the zero point, whose share of every sum the bias takes out, and laid out
    # [n][h][w][c], so that the unit's four channels at a tap are one 32-bit word of A. The
    # padded input is realized, then its transpose: unrealized, the transpose fused into
    # the conv's A; realized in one kernel with the quantize before it, that kernel read
    # across channels and took 3 ms for 64 x 58 x 58. One thread, ResNet-18's 3x3 convs
    # took 0.74 ms (64 on 56 x 56), 0.70 (256 on 14 x 14) and 1.0 (the stem) against 1.1,
    # 1.7 and 2.4 with A read [c][h][w]
    # x_q itself is realized first: unrealized, a residual's value (the Quantize of an Add
    # of the Dequantize of one before it) was computed again in each kernel that read it,
    # its chain back to the last realized value (0.5-0.8 ms for a pad of 64 x 58 x 58)
    extra = weight.shape[1] - x.shape[1]
    x = x.realize().pad(((0, 0), (0, extra), *pads), value=zx).contiguous().realize()
    x = x.permute(0, 2, 3, 1).contiguous().realize().permute(0, 3, 1, 2)
    acc = x.cast(dtypes.int32).conv2d(weight.cast(dtypes.int32), stride=strides,
                                      dilation=dilations)
    # realized in float: fused into the conv's kernel as its epilogue, what comes after it
    # (a Quantize, an Add of a residual, a Quantize again) ran the conv at 6x its time
    return [(acc.cast(dtypes.float32) * scale + bias).realize()]


def _integer_matmul(ctx: Context, node: NodeArgs) -> list[Value]:
    """INTEGER_MATMUL: MatMul's or Gemm's float output from x_q and w_q, summed in int32
    (`fused`): x_q @ w_q on the matrix unit where the device has one, then per output column
    acc * sx * sw[j] + (bias - zx * sx * sw[j] * sum w[:, j]). The weight is uploaded [k][n]
    (Gemm's transB transposed at upload), once per model constant."""
    w_q = node.inputs[3]
    keys = [(id(w_q), (-2, i)) for i in range(3)]
    x, sx, zx = _unsigned(ctx, node)
    if keys[0] not in ctx.uploaded:
        w = np.asarray(w_q).T if node.attr("transB", 0) else np.asarray(w_q)
        scale = np.broadcast_to(
            np.float64(sx) * ctx.host(node.inputs[4]).astype(np.float64).reshape(-1),
            (w.shape[1],))
        bias = 0.0 if node.input(5) is None else ctx.host(node.inputs[5]).astype(np.float64)
        bias = bias - zx * w.astype(np.int64).sum(axis=0) * scale
        ctx.uploaded.update(zip(keys, [Tensor(np.ascontiguousarray(v), device=ctx.device)
                                       for v in (w, scale.astype(np.float32),
                                                 bias.astype(np.float32))]))
    on_device = [ctx.uploaded[key] for key in keys]
    x = x.cast(dtypes.int32)
    # the zero point's share of each sum, zx * sum w[:, j], is in the bias
    product = x @ on_device[0].cast(dtypes.int32)
    return [product.cast(dtypes.float32) * on_device[1] + on_device[2]]


FUSED: dict[str, Op] = {INTEGER_CONV: _integer_conv, INTEGER_MATMUL: _integer_matmul}
