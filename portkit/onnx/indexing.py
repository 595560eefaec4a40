"""ONNX's selection, scatter and scan ops as Tensor operations (see ops.py for the
conventions): TopK, the Scatter family, GatherND, Compress, NonZero, CumSum, CumProd, Einsum.

A scatter with a reduction is a one-hot comparison of the indices against every position of
the target axis, reduced over the updates: the Tensor API has no scatter_reduce, and the one-hot
form is exact for every reduction and dtype."""
from __future__ import annotations

from math import prod

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, einsum

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _wrapped(indices: Tensor, size: int) -> Tensor:
    """Negative indices counted from the end of an axis of `size`."""
    return (indices < 0)._where(indices + size, indices)


def _along(x: Tensor, axis: int, index: Value, ctx: Context) -> Tensor:
    """x[..., index, ...] with `index` (1-d) on `axis`."""
    return x[(slice(None),) * axis + (ctx.tensor(index),)]


@op("TopK")
def _top_k(ctx: Context, node: NodeArgs) -> list[Value]:
    x = ctx.tensor(node.inputs[0])
    k = ctx.ints(node.inputs[1])[0] if ctx.opset >= 10 else node.attr("k")
    values, indices = x.topk(k, node.attr("axis", -1), bool(node.attr("largest", 1)))
    return [values, indices]


# -- scatter -------------------------------------------------------------------------------------

_COMBINE = {
    "add": (lambda t, axis: t.sum(axis), lambda a, b: a + b, 0),
    "mul": (lambda t, axis: t.prod(axis), lambda a, b: a * b, 1),
    "max": (lambda t, axis: t.amax(axis), Tensor.maximum, None),
    "min": (lambda t, axis: t.amin(axis), Tensor.minimum, None),
}


def _neutral(dtype, reduction: str):
    """The value that leaves `reduction` unchanged."""
    if reduction in ("add", "mul"):
        return _COMBINE[reduction][2]
    if dtype.is_float:
        return float("-inf") if reduction == "max" else float("inf")
    return int(dtype.min if reduction == "max" else dtype.max)


def _sent(hot: Tensor, updates: Tensor, axis: int, dtype, reduction: str
          ) -> tuple[Tensor, Tensor]:
    """(touched, reduced): whether any update goes to each position, and the updates each
    `hot` entry sends there combined by `reduction`, over the updates' axis `axis`."""
    reduce = _COMBINE[reduction][0]
    sent = hot._where(updates, _neutral(dtype, reduction)).cast(dtype)
    return hot.any(axis), reduce(sent, axis)


@op("ScatterElements", "Scatter")
def _scatter_elements(ctx: Context, node: NodeArgs) -> list[Value]:
    data, indices, updates = (ctx.tensor(v) for v in node.inputs)
    axis = node.attr("axis", 0) % data.ndim
    indices = _wrapped(indices, data.shape[axis])
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return [data.scatter(axis, indices, updates)]
    # hot[..., i, ..., j]: the update at i goes to position j of data's axis
    size, rank = data.shape[axis], data.ndim
    positions = Tensor.arange(size, device=data.device).cast(indices.dtype)
    hot = indices.unsqueeze(-1) == positions
    touched, reduced = _sent(hot, updates.unsqueeze(-1), axis, data.dtype, reduction)
    order = (*range(axis), rank - 1, *range(axis, rank - 1))     # j back to `axis`
    # the updates' other axes may be shorter than data's: the rest is untouched
    pads = tuple((0, 0) if a == axis else (0, d - u)
                 for a, (d, u) in enumerate(zip(data.shape, updates.shape)))
    touched = touched.permute(*order).pad(pads, False)
    reduced = reduced.permute(*order).pad(pads, _neutral(data.dtype, reduction))
    return [touched._where(_COMBINE[reduction][1](data, reduced), data)]


@op("ScatterND")
def _scatter_nd(ctx: Context, node: NodeArgs) -> list[Value]:
    data, indices, updates = (ctx.tensor(v) for v in node.inputs)
    depth = indices.shape[-1]
    cells, rest = prod(data.shape[:depth]), data.shape[depth:]
    flat_data = data.reshape(cells, *rest)
    target = _flat_index(indices, data.shape[:depth]).reshape(-1)
    count = target.shape[0]
    flat_updates = updates.reshape(count, *rest)
    reduction = node.attr("reduction", "none")
    positions = Tensor.arange(cells, device=data.device).cast(target.dtype)
    hot = (target.reshape(1, count) == positions.reshape(cells, 1))    # (cells, updates)
    hot = hot.reshape(cells, count, *([1] * len(rest)))
    sent = flat_updates.unsqueeze(0)
    if reduction == "none":      # duplicate indices are undefined in ONNX; one of them wins
        written = hot._where(sent, 0).cast(data.dtype).sum(1)
        out = hot.any(1)._where(written, flat_data)
    else:
        touched, reduced = _sent(hot, sent, 1, data.dtype, reduction)
        out = touched._where(_COMBINE[reduction][1](flat_data, reduced), flat_data)
    return [out.reshape(*data.shape)]


def _flat_index(indices: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The row-major position in `shape` of each index tuple (the last axis of `indices`)."""
    strides = [prod(shape[i + 1:]) for i in range(len(shape))]
    flat = None
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        part = _wrapped(indices[..., axis], size) * stride
        flat = part if flat is None else flat + part
    return flat


@op("GatherND")
def _gather_nd(ctx: Context, node: NodeArgs) -> list[Value]:
    data, indices = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    batch = node.attr("batch_dims", 0)
    depth = indices.shape[-1]
    batches = prod(data.shape[:batch])
    cells = prod(data.shape[batch:batch + depth])
    rest = data.shape[batch + depth:]
    flat = _flat_index(indices, data.shape[batch:batch + depth]).reshape(batches, -1)
    offsets = Tensor.arange(batches, device=data.device).reshape(batches, 1) * cells
    rows = (flat + offsets.cast(flat.dtype)).reshape(-1)
    taken = data.reshape(batches * cells, *rest)[rows]
    return [taken.reshape(*indices.shape[:-1], *rest)]


# -- data-dependent shapes: the selection is read back, the values stay on the device -------

@op("Compress")
def _compress(ctx: Context, node: NodeArgs) -> list[Value]:
    x, keep = ctx.tensor(node.inputs[0]), ctx.host(node.inputs[1]).astype(bool)
    axis = node.attr("axis")
    if axis is None:
        x, axis = x.reshape(-1), 0
    axis %= x.ndim
    return [_along(x, axis, np.nonzero(keep[:x.shape[axis]])[0].astype(np.int32), ctx)]


@op("NonZero")
def _non_zero(ctx: Context, node: NodeArgs) -> list[Value]:
    return [np.array(np.nonzero(ctx.host(node.inputs[0])), np.int64)]


# -- scans -------------------------------------------------------------------------------------

def _scan(method) -> Op:
    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        x = ctx.tensor(node.inputs[0])
        axis = ctx.ints(node.inputs[1])[0] % x.ndim
        reverse, exclusive = node.attr("reverse", 0), node.attr("exclusive", 0)
        x = x.flip(axis) if reverse else x
        if exclusive:      # shift by one: the identity first, the last element dropped
            identity = 0 if method is Tensor.cumsum else 1
            pads = [(0, 0)] * x.ndim
            pads[axis] = (1, -1)
            x = x.pad(tuple(pads), identity)
        out = method(x, axis)
        return [out.flip(axis) if reverse else out]
    return run


OPS.update(CumSum=_scan(Tensor.cumsum), CumProd=_scan(Tensor.cumprod))


@op("Einsum")
def _einsum(ctx: Context, node: NodeArgs) -> list[Value]:
    """portkit.einsum after two rewrites it does not do itself: "..." becomes letters of its
    own, and a letter repeated within an operand takes that operand's diagonal."""
    operands = [ctx.tensor(v) for v in node.inputs]
    equation = node.attr("equation").replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    spare = (c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
             if c not in equation)
    widest = max((x.ndim - len(t) + 3 for x, t in zip(operands, terms) if "..." in t),
                 default=0)
    dots = "".join(next(spare) for _ in range(widest))
    terms = [t.replace("...", dots[widest - (x.ndim - len(t) + 3):]) for x, t in
             zip(operands, terms)]
    if not arrow:       # implicit output: the broadcast axes, then the letters seen once
        rhs = "..." + "".join(sorted(c for c in set("".join(terms)) - set(dots)
                                     if "".join(terms).count(c) == 1))
    rhs = rhs.replace("...", dots)
    for k, (x, term) in enumerate(zip(operands, terms)):
        while len(set(term)) < len(term):
            letter = next(c for c in term if term.count(c) > 1)
            i = term.index(letter)
            j = term.index(letter, i + 1)
            x = x.diagonal(0, i, j)
            term = term[:i] + term[i + 1:j] + term[j + 1:] + letter
        operands[k], terms[k] = x, term
    return [einsum(",".join(terms) + "->" + rhs, *operands)]


@op("Unique")
def _unique(ctx: Context, node: NodeArgs) -> list[Value]:
    """Read back: which values are distinct decides the output's shape."""
    x = ctx.host(node.inputs[0])
    axis = node.attr("axis")
    values, first, inverse, counts = np.unique(x, True, True, True, axis=axis, equal_nan=False)
    if not node.attr("sorted", 1):      # in the order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    outputs = [values] + [a.reshape(-1).astype(np.int64) for a in (first, inverse, counts)]
    return [outputs[0] if isinstance(node.inputs[0], np.ndarray) else ctx.tensor(outputs[0]),
            *outputs[1:]][:node.outputs]


@op("ReverseSequence")
def _reverse_sequence(ctx: Context, node: NodeArgs) -> list[Value]:
    x, lengths = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    batch_axis, time_axis = node.attr("batch_axis", 1), node.attr("time_axis", 0)
    steps = x.shape[time_axis]
    time = Tensor.arange(steps, device=x.device).reshape(1, steps)
    length = lengths.reshape(-1, 1).cast(time.dtype)
    source = (time < length)._where(length - 1 - time, time)       # (batch, time)
    if batch_axis > time_axis:
        source = source.transpose(0, 1)
    shape = [1] * x.ndim
    shape[batch_axis], shape[time_axis] = x.shape[batch_axis], steps
    return [x.gather(time_axis, source.reshape(*shape).expand(*x.shape))]


@op("TensorScatter")
def _tensor_scatter(ctx: Context, node: NodeArgs) -> list[Value]:
    past, update = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    axis = node.attr("axis", -2) % past.ndim
    size, count = past.shape[axis], update.shape[axis]
    positions = Tensor.arange(size, device=past.device).reshape(1, size)
    start = Tensor.zeros(past.shape[0], 1, dtype=positions.dtype, device=past.device) \
        if node.input(2) is None else ctx.tensor(node.inputs[2]).reshape(-1, 1).cast(
            positions.dtype)
    offset = positions - start           # (batch, size): which update row lands here
    if node.attr("mode", "linear") == "circular":
        offset = offset % size
    written = (offset >= 0) & (offset < count)
    shape = [1] * past.ndim
    shape[0], shape[axis] = past.shape[0], size
    source = written._where(offset, 0).cast(offset.dtype).reshape(*shape)
    gather_shape = list(update.shape)
    gather_shape[axis] = size
    taken = update.gather(axis, source.expand(*gather_shape))
    return [written.reshape(*shape)._where(taken, past)]


@op("OptionalHasElement")
def _optional_has_element(ctx: Context, node: NodeArgs) -> list[Value]:
    return [np.array(node.input(0) is not None)]


@op("OptionalGetElement")
def _optional_get_element(ctx: Context, node: NodeArgs) -> list[Value]:
    return [node.inputs[0]]
