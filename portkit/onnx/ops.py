"""ONNX ops as Tensor operations: one function per op, registered in `OPS` by its ONNX name.

Each function takes the run's `Context` and the node's `NodeArgs` (attributes and inputs, each
a Tensor, a host numpy array, or None for an omitted optional input) and returns the node's
outputs. Attribute defaults and opset differences follow the ONNX operator docs; an attribute
value portkit cannot honour is reported at load time by `unsupported_attributes`.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from portkit import runtime
from portkit.abi import dtypes
from portkit.abi.errors import UnsupportedDType
from portkit.nn import functional as F
from portkit.tensor import Tensor, cat

Value = Any   # a Tensor, a numpy array (a host value) or None


# a model's constants on the device: by id, and by id and axis order (Context.laid_out)
Uploads = dict[int | tuple[int, tuple[int, ...]], Tensor]


@dataclass
class Context:
    """What every op may need: the device, the model's opset, and the model's constants (by
    id) with the Tensors they were uploaded to."""

    device: str | None
    opset: int
    uploaded: Uploads
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    scope: dict[str, Any] = field(default_factory=dict)     # the running graph's values

    def tensor(self, value: Value) -> Tensor:
        """`value` on the device; int64 is narrowed to int32 where every value fits. A model
        constant is uploaded once; any other array (an input, a value computed on the host)
        every time, since its id may be another array's by the next run."""
        if isinstance(value, Tensor):
            return value
        key = id(value)
        if self.constants.get(key) is not value:
            return self._upload(np.asarray(value))
        if key not in self.uploaded:
            self.uploaded[key] = self._upload(np.asarray(value))
        return self.uploaded[key]

    def laid_out(self, value: Value, order: tuple[int, ...]) -> Tensor:
        """`value` as `tensor` gives it, but a model constant is uploaded once with its axes
        in `order` (contiguous so) and given back as a view in its own order: a conv's weights
        [cout][cin][kh][kw] laid out [cin][kh][kw][cout] are read along the output channels
        the way a packed kernel's panel holds them, a contiguous copy instead of a
        transposing one."""
        key = id(value)
        if isinstance(value, Tensor) or self.constants.get(key) is not value:
            return self.tensor(value)
        if (key, order) not in self.uploaded:
            array = np.ascontiguousarray(np.asarray(value).transpose(order))
            self.uploaded[(key, order)] = self._upload(array).permute(
                *(int(axis) for axis in np.argsort(order)))
        return self.uploaded[(key, order)]

    def _upload(self, array: np.ndarray) -> Tensor:
        array = self._narrowed(array)      # still int64: values beyond int32, kept as int64
        wide = array.dtype == np.int64
        return Tensor(array, dtype=dtypes.int64 if wide else None, device=self.device)

    def _narrowed(self, array: np.ndarray) -> np.ndarray:
        if array.dtype.kind in "iu" and array.dtype.itemsize == 8:
            info = np.iinfo(np.int32)
            if array.size == 0 or (array.min() >= info.min and array.max() <= info.max):
                return array.astype(np.int32)
            device = runtime.get(self.device)
            if dtypes.by_name(array.dtype.name) not in device.capabilities.dtypes:
                raise UnsupportedDType(f"an {array.dtype} tensor of the model holds values "
                                       f"beyond int32 and {device.name} has no {array.dtype}; "
                                       "run the model on a device with 64-bit integers")
        return array

    @staticmethod
    def host(value: Value) -> np.ndarray:
        """`value` as a numpy array (a Tensor is read back from the device)."""
        return value.numpy() if isinstance(value, Tensor) else np.asarray(value)

    def ints(self, value: Value) -> list[int]:
        return [int(v) for v in self.host(value).reshape(-1)]


@dataclass
class NodeArgs:
    """One node's attributes, inputs and number of outputs."""

    attrs: dict[str, Any]
    inputs: list[Value]
    outputs: int

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def input(self, index: int) -> Value:
        return self.inputs[index] if index < len(self.inputs) else None


Op = Callable[[Context, NodeArgs], list[Value]]
# (attributes, number of outputs) -> a reason the node cannot run, or something falsy
Check = Callable[[dict[str, Any], int], Any]


def registrar(table: dict[str, Op]) -> Callable[..., Callable[[Op], Op]]:
    """A decorator that registers a function in `table` under one or more ONNX op names."""
    def op(*names: str) -> Callable[[Op], Op]:
        def register(fn: Op) -> Op:
            for name in names:
                table[name] = fn
            return fn
        return register
    return op


OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def unary(name: str, fn: Callable[[Tensor, NodeArgs], Tensor]) -> None:
    OPS[name] = lambda ctx, node: [fn(ctx.tensor(node.inputs[0]), node)]


# -- elementwise -----------------------------------------------------------------------------

for _name, _fn in {
    "Abs": lambda x, n: x.abs(), "Neg": lambda x, n: -x, "Exp": lambda x, n: x.exp(),
    "Log": lambda x, n: x.log(), "Sqrt": lambda x, n: x.sqrt(),
    "Reciprocal": lambda x, n: x.reciprocal(), "Sin": lambda x, n: x.sin(),
    "Cos": lambda x, n: x.cos(), "Asin": lambda x, n: x.asin(), "Acos": lambda x, n: x.acos(),
    "Atan": lambda x, n: x.atan(), "Tan": lambda x, n: x.tan(), "Tanh": lambda x, n: x.tanh(),
    "Sigmoid": lambda x, n: x.sigmoid(), "Relu": lambda x, n: x.relu(),
    "Erf": lambda x, n: x.erf(), "Floor": lambda x, n: x.floor(), "Ceil": lambda x, n: x.ceil(),
    "Round": lambda x, n: x.round(), "Sign": lambda x, n: x.sign(),
    "Softplus": lambda x, n: x.softplus(), "Not": lambda x, n: x.logical_not(),
    "Identity": lambda x, n: x, "IsNaN": lambda x, n: x.isnan(),
    "Softsign": lambda x, n: F.softsign(x),
    "LeakyRelu": lambda x, n: x.leaky_relu(n.attr("alpha", 0.01)),
    "Elu": lambda x, n: F.elu(x, n.attr("alpha", 1.0)),
    "Celu": lambda x, n: F.celu(x, n.attr("alpha", 1.0)),
    "Selu": lambda x, n: F.elu(x, n.attr("alpha", 1.6732632423543772))
    * n.attr("gamma", 1.0507009873554805),
    "ThresholdedRelu": lambda x, n: (x > n.attr("alpha", 1.0))._where(x, 0.0),
    "HardSigmoid": lambda x, n: (x * n.attr("alpha", 0.2) + n.attr("beta", 0.5)).clip(0, 1),
    "HardSwish": lambda x, n: F.hardswish(x),
    "Mish": lambda x, n: F.mish(x),
    "Gelu": lambda x, n: x.gelu(n.attr("approximate", "none")),
    "Swish": lambda x, n: x * (x * n.attr("alpha", 1.0)).sigmoid(),
    "Sinh": lambda x, n: x.sinh(),
    "Cosh": lambda x, n: x.cosh(),
    "Asinh": lambda x, n: (x + (x * x + 1).sqrt()).log(),
    "Acosh": lambda x, n: (x + (x * x - 1).sqrt()).log(),
    "Atanh": lambda x, n: ((1 + x) / (1 - x)).log() * 0.5,
    "BitwiseNot": lambda x, n: ~x,
    "Shrink": lambda x, n: (x < -n.attr("lambd", 0.5))._where(
        x + n.attr("bias", 0.0), (x > n.attr("lambd", 0.5))._where(x - n.attr("bias", 0.0), 0)
    ).cast(x.dtype),
    "IsInf": lambda x, n: x.isinf() if n.attr("detect_negative", 1) and n.attr(
        "detect_positive", 1) else x.isinf() & ((x > 0) if not n.attr("detect_negative", 1)
                                                else (x < 0)),
}.items():
    unary(_name, _fn)


def _binary(fn: Callable[[Tensor, Tensor], Tensor]) -> Op:
    return lambda ctx, node: [fn(ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1]))]


for _name, _fn in {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Equal": lambda a, b: a == b, "Less": lambda a, b: a < b, "Greater": lambda a, b: a > b,
    "LessOrEqual": lambda a, b: a <= b, "GreaterOrEqual": lambda a, b: a >= b,
    "And": lambda a, b: a & b, "Or": lambda a, b: a | b, "Xor": lambda a, b: a ^ b,
    "BitwiseAnd": lambda a, b: a & b, "BitwiseOr": lambda a, b: a | b,
    "BitwiseXor": lambda a, b: a ^ b,
}.items():
    OPS[_name] = _binary(_fn)


@op("SwiGLU")
def _swiglu(ctx: Context, node: NodeArgs) -> list[Value]:
    a, b = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    return [a * (a * node.attr("alpha", 1.0)).sigmoid() * b]


@op("BitCast")
def _bitcast(ctx: Context, node: NodeArgs) -> list[Value]:
    import onnx

    target = dtypes.from_numpy(onnx.helper.tensor_dtype_to_np_dtype(node.attr("to")))
    return [ctx.tensor(node.inputs[0]).bitcast(target)]


@op("Div")
def _div(ctx: Context, node: NodeArgs) -> list[Value]:
    a, b = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    if a.dtype.is_float:
        return [a / b]
    # ONNX divides integers towards zero (C), portkit's // rounds down (Python, PyTorch).
    floor = a // b
    return [floor + ((a % b != 0) & ((a < 0) ^ (b < 0))).cast(floor.dtype)]


@op("BitShift")
def _bit_shift(ctx: Context, node: NodeArgs) -> list[Value]:
    x, y = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    left = node.attr("direction") == "LEFT"
    shifted = x << y if left else x >> y
    # A shift by the width or more, or by a negative count, empties the value (a right shift
    # of a negative signed value fills it with ones); C leaves these undefined.
    out_of_range = (y < 0) | (y >= x.dtype.bits)
    emptied = 0 if left or x.dtype.kind != "int" else (x < 0)._where(-1, 0)
    return [out_of_range._where(emptied, shifted).cast(x.dtype)]


def _fmod(a: Tensor, b: Tensor) -> Tensor:
    """C's fmod for floats, including a finite value over an infinite one (the value)."""
    return (b.isinf() & ~a.isinf())._where(a, a - b * (a / b).trunc())


@op("Mod")
def _mod(ctx: Context, node: NodeArgs) -> list[Value]:
    a, b = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    if a.dtype.is_float:
        rest = _fmod(a, b)
        if node.attr("fmod", 0):
            return [rest]
        # numpy's mod: the sign of the divisor, so -3 mod inf is inf
        return [((rest != 0) & ((rest < 0) ^ (b < 0)))._where(rest + b, rest)]
    if not node.attr("fmod", 0):
        return [a % b]                       # the sign of the divisor, as Python
    rest = a % b
    return [((rest != 0) & ((a < 0) ^ (b < 0)))._where(rest - b, rest)]


@op("Pow")
def _pow(ctx: Context, node: NodeArgs) -> list[Value]:
    x, exponent = ctx.tensor(node.inputs[0]), node.inputs[1]
    if np.prod(exponent.shape) == 1:
        return [x.pow(ctx.host(exponent).reshape(-1)[0].item()).cast(x.dtype)]
    y = ctx.tensor(exponent).cast(x.dtype)
    if x.dtype.is_float:            # C's pow, -0 included: (-0) ** -1 is -inf
        return [x.pow(y)]
    magnitude = (x.abs().log() * y).exp()
    odd = (y.abs() % 2) == 1
    signed = ((x < 0) & odd)._where(-magnitude, magnitude)
    fractional = (x < 0) & (y != y.trunc())
    return [(y == 0)._where(1.0, fractional._where(float("nan"), signed)).cast(x.dtype)]


@op("Where")
def _where(ctx: Context, node: NodeArgs) -> list[Value]:
    cond, a, b = (ctx.tensor(v) for v in node.inputs)
    return [cond.cast(dtypes.bool_)._where(a, b)]


def _fold(combine: Callable[[Tensor, Tensor], Tensor], mean: bool = False) -> Op:
    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        values = [ctx.tensor(v) for v in node.inputs]
        out = values[0]
        for value in values[1:]:
            out = combine(out, value)
        return [out / len(values) if mean else out]
    return run


OPS.update(Max=_fold(Tensor.maximum), Min=_fold(Tensor.minimum), Sum=_fold(Tensor.add),
           Mean=_fold(Tensor.add, mean=True))


@op("Clip")
def _clip(ctx: Context, node: NodeArgs) -> list[Value]:
    lo, hi = (node.input(1), node.input(2)) if ctx.opset >= 11 else (
        node.attr("min"), node.attr("max"))
    x = ctx.tensor(node.inputs[0])
    lo = None if lo is None else ctx.host(lo).item()
    hi = None if hi is None else ctx.host(hi).item()
    return [x if lo is None and hi is None else x.clip(lo, hi)]


@op("PRelu")
def _prelu(ctx: Context, node: NodeArgs) -> list[Value]:
    x, slope = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    return [(x < 0)._where(x * slope, x)]


@op("Cast", "CastLike")
def _cast(ctx: Context, node: NodeArgs) -> list[Value]:
    import onnx

    x = ctx.tensor(node.inputs[0])
    if len(node.inputs) > 1:
        target = ctx.tensor(node.inputs[1]).dtype
    else:
        target = dtypes.from_numpy(onnx.helper.tensor_dtype_to_np_dtype(node.attr("to")))
    if target.bits == 64 and target.is_int:
        target = dtypes.int32 if x.dtype.is_float or x.dtype.bits <= 32 else target
    return [x.cast(target)]


@op("Dropout")
def _dropout(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])      # inference: the identity, and an all-true mask
    return [x, Tensor.ones(*x.shape, dtype=dtypes.bool_, device=x.device)][:node.outputs]


# -- shapes ----------------------------------------------------------------------------------

@op("Shape")
def _shape(ctx: Context, node: NodeArgs) -> list[Value]:
    shape = node.inputs[0].shape
    return [np.array(shape[node.attr("start", 0):node.attr("end", len(shape))], np.int64)]


@op("Size")
def _size(ctx: Context, node: NodeArgs) -> list[Value]:
    return [np.array(prod(node.inputs[0].shape), np.int64)]


@op("Reshape")
def _reshape(ctx: Context, node: NodeArgs) -> list[Value]:
    x, shape = ctx.tensor(node.inputs[0]), ctx.ints(node.inputs[1])
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(*shape)]


@op("Flatten")
def _flatten(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axis = node.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(prod(x.shape[:axis]), prod(x.shape[axis:]))]


@op("Transpose")
def _transpose(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [x.permute(*node.attr("perm", range(x.ndim - 1, -1, -1)))]


def _axes_of(ctx: Context, node: NodeArgs, since: int, index: int = 1) -> list[int] | None:
    """The `axes` of a node: an attribute before opset `since`, an input from it on."""
    axes = node.input(index) if ctx.opset >= since else node.attr("axes")
    return None if axes is None else ctx.ints(axes)


@op("Squeeze")
def _squeeze(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axes = _axes_of(ctx, node, 13)
    axes = [a % x.ndim for a in axes] if axes is not None else [
        i for i, s in enumerate(x.shape) if s == 1]
    return [x.reshape(*(s for i, s in enumerate(x.shape) if i not in axes))]


@op("Unsqueeze")
def _unsqueeze(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axes = _axes_of(ctx, node, 13)
    rank = x.ndim + len(axes)
    shape, rest = [], iter(x.shape)
    axes = {a % rank for a in axes}
    for i in range(rank):
        shape.append(1 if i in axes else next(rest))
    return [x.reshape(*shape)]


@op("Concat")
def _concat(ctx: Context, node: NodeArgs) -> list[Value]:
    values = [ctx.tensor(v) for v in node.inputs if v is not None]
    return [cat(values, node.attr("axis"))]


@op("Split")
def _split(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axis = node.attr("axis", 0) % x.ndim
    sizes = node.input(1) if ctx.opset >= 13 else node.attr("split")
    if sizes is None:
        parts = node.attr("num_outputs", node.outputs)
        step = -(-x.shape[axis] // parts)
        sizes = [min(step, x.shape[axis] - i * step) for i in range(parts)]
    return list(x.split(ctx.ints(sizes), axis))


@op("Slice")
def _slice(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    if ctx.opset >= 10:
        starts, ends = ctx.ints(node.inputs[1]), ctx.ints(node.inputs[2])
        axes = ctx.ints(node.input(3)) if node.input(3) is not None else range(len(starts))
        steps = ctx.ints(node.input(4)) if node.input(4) is not None else [1] * len(starts)
    else:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes", range(len(starts))), [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        begin, stop, step = slice(start, end, step).indices(x.shape[axis % x.ndim])
        # indices() says "before the first element" as -1, which a slice reads as the last
        index[axis % x.ndim] = slice(begin, None if stop < 0 else stop, step)
    return [x[tuple(index)]]


@op("Gather")
def _gather(ctx: Context, node: NodeArgs) -> list[Value]:
    # a negative index counts from the end, once (checked on the device when it is data)
    x, indices = ctx.tensor(node.inputs[0]), node.inputs[1]
    axis = node.attr("axis", 0) % x.ndim
    if not isinstance(indices, Tensor):
        indices = np.asarray(indices)
    return [x._take(axis, indices, "Gather", wrap=True)]


@op("GatherElements")
def _gather_elements(ctx: Context, node: NodeArgs) -> list[Value]:
    x, indices = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    axis = node.attr("axis", 0) % x.ndim
    return [x._gather_elements(axis, indices, "GatherElements", wrap=True)]


@op("Expand")
def _expand(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    return [x.expand(*np.broadcast_shapes(x.shape, tuple(ctx.ints(node.inputs[1]))))]


@op("Tile")
def _tile(ctx: Context, node: NodeArgs) -> list[Value]:
    return [ctx.tensor(node.inputs[0]).repeat(*ctx.ints(node.inputs[1]))]


@op("Pad")
def _pad(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    if ctx.opset >= 11:
        pads = ctx.ints(node.inputs[1])
        value = node.input(2)
        value = 0 if value is None or ctx.host(value).size == 0 else ctx.host(value).item()
        axes = ctx.ints(node.input(3)) if node.input(3) is not None else range(x.ndim)
    else:
        pads, value, axes = node.attr("pads"), node.attr("value", 0.0), range(x.ndim)
    pairs = [(0, 0)] * x.ndim
    for k, axis in enumerate(axes):
        pairs[axis % x.ndim] = (pads[k], pads[k + len(pads) // 2])
    mode = node.attr("mode", "constant")
    if mode == "constant":
        return [x.pad(tuple(pairs), value)]
    for axis, (before, after) in enumerate(pairs):   # a gather of mirrored or wrapped rows
        if before or after:
            size = x.shape[axis]
            source = np.arange(-before, size + after)
            if mode == "edge":
                source = np.clip(source, 0, size - 1)
            elif mode == "wrap":
                source = source % size
            else:       # reflect: mirrored about the first and last element
                period = 2 * (size - 1) or 1
                source = source % period
                source = np.where(source >= size, period - source, source)
            x = x[(slice(None),) * axis + (ctx.tensor(source.astype(np.int32)),)]
    return [x]


@op("CenterCropPad")
def _center_crop_pad(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    axes = node.attr("axes", range(x.ndim))
    pairs = [(0, 0)] * x.ndim
    for axis, size in zip(axes, ctx.ints(node.inputs[1])):
        grow = size - x.shape[axis % x.ndim]   # negative: crop; the odd one at the end
        half = grow // 2 if grow >= 0 else -((-grow) // 2)
        pairs[axis % x.ndim] = (half, grow - half)
    return [x.pad(tuple(pairs))]


@op("Constant")
def _constant(ctx: Context, node: NodeArgs) -> list[Value]:
    for name, dtype in (("value", None), ("value_float", np.float32),
                        ("value_floats", np.float32), ("value_int", np.int64),
                        ("value_ints", np.int64)):
        if name in node.attrs:
            return [np.asarray(node.attrs[name], dtype)]
    raise AssertionError("CHECKS['Constant'] lets no other attribute through")


@op("ConstantOfShape")
def _constant_of_shape(ctx: Context, node: NodeArgs) -> list[Value]:
    value = np.asarray(node.attr("value", np.zeros(1, np.float32))).reshape(-1)
    shape = ctx.ints(node.inputs[0])
    return [ctx.tensor(np.full(shape, value[0], value.dtype))]


@op("Range")
def _range(ctx: Context, node: NodeArgs) -> list[Value]:
    start, limit, delta = (ctx.host(v).item() for v in node.inputs)
    dtype = ctx.host(node.inputs[0]).dtype
    return [ctx.tensor(np.arange(start, limit, delta, dtype))]


CHECKS.update(
    Gelu=lambda a, n: a.get("approximate", "none") not in ("none", "tanh") and "approximate",
    Constant=lambda a, n: not ({"value", "value_float", "value_floats", "value_int",
                                "value_ints"} & set(a)) and f"attribute {sorted(a)}",
)
