"""ONNX's control flow: If, Loop and Scan (see ops.py for the conventions). Their branches and
bodies are loaded as Models of their own (`portkit.onnx.Model`) and run with the enclosing
graph's values in scope; a condition or trip count is read on the host."""
from __future__ import annotations

from typing import Any

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _outputs(ctx: Context, body: Any, values: list[Value]) -> list[Value]:
    """The body's outputs, run on `values` (its inputs in order) in the current scope."""
    env = body.run(dict(zip(body.inputs, values)), outer=ctx.scope)
    return [env[name] for name in body.outputs]


def _stacked(ctx: Context, parts: list[Value], axis: int = 0) -> Value:
    """Per-iteration values stacked along a new `axis`."""
    tensors = [ctx.tensor(p) for p in parts]
    axis = axis % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(axis) for t in tensors], axis)


@op("If")
def _if(ctx: Context, node: NodeArgs) -> list[Value]:
    taken = bool(ctx.host(node.inputs[0]).reshape(-1)[0])
    return _outputs(ctx, node.attr("then_branch" if taken else "else_branch"), [])


@op("Loop")
def _loop(ctx: Context, node: NodeArgs) -> list[Value]:
    body = node.attr("body")
    trips = None if node.input(0) is None else int(ctx.host(node.inputs[0]).reshape(-1)[0])
    going = True if node.input(1) is None else bool(ctx.host(node.inputs[1]).reshape(-1)[0])
    carried = list(node.inputs[2:])
    scans: list[list[Value]] = [[] for _ in range(len(body.outputs) - 1 - len(carried))]
    step = 0
    while going and (trips is None or step < trips):
        results = _outputs(ctx, body, [np.array(step, np.int64), np.array(going), *carried])
        going = bool(ctx.host(results[0]).reshape(-1)[0])
        carried = results[1:1 + len(carried)]
        for parts, value in zip(scans, results[1 + len(carried):]):
            parts.append(value)
        step += 1
    return carried + [_stacked(ctx, parts) for parts in scans]


def _scan(ctx: Context, node: NodeArgs, states: list[Value], sequences: list[Tensor]
          ) -> list[Value]:
    """One Scan (opset 9 and later) over `sequences`, from `states`."""
    body, count = node.attr("body"), len(sequences)
    axes = node.attr("scan_input_axes", [0] * count)
    directions = node.attr("scan_input_directions", [0] * count)
    steps = sequences[0].shape[axes[0] % sequences[0].ndim]
    outputs: list[list[Value]] = [[] for _ in range(len(body.outputs) - len(states))]
    for t in range(steps):
        slices = [s[(slice(None),) * (a % s.ndim) + (steps - 1 - t if d else t,)]
                  for s, a, d in zip(sequences, axes, directions)]
        results = _outputs(ctx, body, [*states, *slices])
        states = results[:len(states)]
        for parts, value in zip(outputs, results[len(states):]):
            parts.append(value)
    out_axes = node.attr("scan_output_axes", [0] * len(outputs))
    out_directions = node.attr("scan_output_directions", [0] * len(outputs))
    return states + [_stacked(ctx, parts[::-1] if d else parts, a)
                     for parts, a, d in zip(outputs, out_axes, out_directions)]


@op("Scan")
def _scan_op(ctx: Context, node: NodeArgs) -> list[Value]:
    count = node.attr("num_scan_inputs")
    if ctx.opset >= 9:
        inputs = node.inputs
        return _scan(ctx, node, inputs[:len(inputs) - count],
                     [ctx.tensor(v) for v in inputs[len(inputs) - count:]])
    # Scan-8: a batch axis first on every input, after the (optional) sequence lengths
    inputs = [ctx.tensor(v) for v in node.inputs[1:]]
    if node.input(0) is not None and len(set(ctx.ints(node.inputs[0]))) > 1:
        raise NotImplementedError("Scan-8 with sequences of different lengths")
    states = len(inputs) - count
    per_batch = [_scan(ctx, node, [v[b] for v in inputs[:states]],
                       [v[b] for v in inputs[states:]]) for b in range(inputs[0].shape[0])]
    return [_stacked(ctx, list(parts)) for parts in zip(*per_batch)]
