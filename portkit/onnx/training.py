"""ONNX's optimizer steps (domain ai.onnx.preview.training) as Tensor operations: Adagrad,
Adam and Momentum, each updating one or more tensors (see ops.py for the conventions). The
learning rate and the update count are scalars, read on the host."""
from __future__ import annotations

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _groups(ctx: Context, node: NodeArgs, per_tensor: int):
    """The learning rate, the update count and, per updated tensor, its `per_tensor` inputs."""
    rate, count = (ctx.host(v).item() for v in node.inputs[:2])
    rest = [ctx.tensor(v) for v in node.inputs[2:]]
    n = len(rest) // per_tensor
    return rate, count, [rest[i::n] for i in range(n)]


@op("Adagrad")
def _adagrad(ctx: Context, node: NodeArgs) -> list[Value]:
    rate, count, groups = _groups(ctx, node, 3)
    rate = rate / (1 + count * node.attr("decay_factor", 0.0))
    xs, hs = [], []
    for x, g, h in groups:
        g = g + x * node.attr("norm_coefficient", 0.0)
        h = h + g * g
        xs.append(x - rate * g / (h.sqrt() + node.attr("epsilon", 1e-6)))
        hs.append(h)
    return xs + hs


@op("Adam")
def _adam(ctx: Context, node: NodeArgs) -> list[Value]:
    rate, count, groups = _groups(ctx, node, 4)
    alpha, beta = node.attr("alpha", 0.9), node.attr("beta", 0.999)
    if count > 0:       # bias correction of the moments
        rate = rate * (1 - beta ** count) ** 0.5 / (1 - alpha ** count)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        g = g + x * node.attr("norm_coefficient", 0.0)
        v = v * alpha + g * (1 - alpha)
        h = h * beta + g * g * (1 - beta)
        step = x - rate * (v / (h.sqrt() + node.attr("epsilon", 1e-6)))
        xs.append(step * (1 - node.attr("norm_coefficient_post", 0.0)))
        vs.append(v)
        hs.append(h)
    return xs + vs + hs


@op("Momentum")
def _momentum(ctx: Context, node: NodeArgs) -> list[Value]:
    rate, count, groups = _groups(ctx, node, 3)
    alpha, beta = node.attr("alpha"), node.attr("beta") if count > 0 else 1.0
    xs, vs = [], []
    for x, g, v in groups:
        g = g + x * node.attr("norm_coefficient")
        v = v * alpha + g * beta
        xs.append(x - rate * ((g + v * alpha) if node.attr("mode") == "nesterov" else v))
        vs.append(v)
    return xs + vs
