"""ONNX's linear quantization as Tensor operations (see ops.py for the conventions):
QuantizeLinear, DequantizeLinear, MatMulInteger and QLinearMatMul, for the integer types.
Rounding is to the nearest even, then the result saturates, as the ONNX reference does."""
from __future__ import annotations

import numpy as np

from portkit.abi import dtypes
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


def _saturated(x: Tensor, dtype) -> Tensor:
    """x rounded to the nearest integer (ties to even) and clipped to `dtype`'s range."""
    return x.round().clip(dtype.min, dtype.max).cast(dtype)


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
    scaled = (x / scale).round()
    if zero is not None:
        scaled = scaled + zero.cast(scaled.dtype)
    return [_saturated(scaled, target)]


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
