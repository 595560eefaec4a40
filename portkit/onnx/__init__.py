"""ONNX models on any portkit backend.

    model = portkit.onnx.load("model.onnx", device="opencl")
    outputs = model(input=np.ones((1, 3, 224, 224), np.float32))    # {"output": array}

The `onnx` package reads the file; every node of the default domain maps to Tensor operations
through the table in `portkit/onnx/ops.py`. What the table lacks fails at load time, with the
list of missing ops. Values that only describe shapes (initializers read as shapes, `Shape`, and
what is computed from them) stay on the host as numpy arrays and are computed there with
`onnx.reference`; everything else runs on the device. 64-bit integers are narrowed to int32
where every value fits, so models with int64 indices run on devices without 64-bit types.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from portkit.abi.errors import PortkitError
from portkit.onnx import (
    attention,
    control,
    indexing,
    nn,
    ops,
    quantize,
    resize,
    rnn,
    signal,
    training,
    validate,
)
from portkit.onnx.ops import Context, NodeArgs, Uploads
from portkit.onnx.validate import InvalidModel
from portkit.tensor import Tensor

__all__ = ["MODULES", "InvalidModel", "Model", "UnsupportedModel", "load", "node_model"]

# the op tables, one module per concern (the node-test page counts passes by module)
MODULES = (ops, nn, attention, control, indexing, quantize, resize, rnn, signal, training)
OPS = {name: fn for module in MODULES for name, fn in module.OPS.items()}
# the nodes the loader rewrites (a QDQ conv run in integers, quantize.fused)
OPS.update(quantize.FUSED)
CHECKS = {name: fn for module in MODULES for name, fn in module.CHECKS.items()}
# the domains whose ops OPS holds (some of each: the optimizer steps, two of ai.onnx.ml)
DOMAINS = ("", "ai.onnx", "ai.onnx.preview.training", "ai.onnx.ml")


_EAGER = object()      # an input signature whose calls portkit.jit cannot replay


class _HostOutput(Exception):
    """An output computed on the host (from constants alone): nothing to replay."""


class UnsupportedModel(PortkitError):
    """The model uses ops or attributes that portkit cannot run; raised by `load`."""


def _onnx():
    try:
        import onnx
    except ImportError:
        raise PortkitError("portkit.onnx needs the onnx package: pip install 'portkit[onnx]'"
                           ) from None
    return onnx


@dataclass
class Node:
    """One ONNX node as the loader runs it: op, attributes (as Python values), value names."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict[str, Any]
    proto: Any = field(repr=False)
    graphs: bool = False        # a graph attribute (a branch, a loop body) holds a Model


@dataclass
class Model:
    """A loaded ONNX graph; call it with the graph inputs by name (numpy arrays or Tensors)."""

    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    output_dtypes: dict[str, np.dtype]
    constants: dict[str, np.ndarray]
    opset: int
    device: str | None = None
    replays: bool = True
    _host: dict[int, Any] = field(default_factory=dict, repr=False)
    _jits: dict[tuple, Any] = field(default_factory=dict, repr=False)
    _uploaded: Uploads = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        """A summary, not the weights: opset, inputs, outputs, node counts by op, weights."""
        ops = Counter(node.op for node in self.nodes)
        weights = sum(int(np.asarray(value).size) for value in self.constants.values())
        return (f"Model(opset={self.opset}, inputs={self.inputs}, outputs={self.outputs}, "
                f"nodes={len(self.nodes)} ({', '.join(f'{op} {n}' for op, n in ops.most_common())})"
                f", constants={len(self.constants)} ({weights:,} values), device={self.device!r})")

    def __call__(self, *args: np.ndarray | Tensor, **named: np.ndarray | Tensor
                 ) -> dict[str, np.ndarray | Tensor]:
        """Runs the graph; outputs are Tensors if any input was one, else numpy arrays.

        With `replays` (the default), calls with inputs of one shape and dtype go through
        portkit.jit: the first two run the graph and record its launches, later ones replay
        them without running the graph's Python. A graph a replay cannot redo (values read
        back to the host, random ops, control flow on values) runs eagerly every call."""
        values = self.bind(args, named)
        tensors_in = any(isinstance(v, Tensor) for v in values.values())
        env = self._replayed(values) if self.replays else None
        env = self.run(values) if env is None else env
        results = {}
        for name in self.outputs:
            value = env[name]
            if tensors_in:
                results[name] = value if isinstance(value, Tensor) else Tensor(
                    value, device=self.device)
            else:
                array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
                results[name] = array.astype(self.output_dtypes.get(name, array.dtype),
                                             copy=False)
        return results

    def _replayed(self, values: dict[str, Any]) -> dict[str, Any] | None:
        """The outputs by name through this input signature's portkit.jit, or None where it
        cannot replay (then the caller runs the graph eagerly)."""
        from portkit.jit import JitError, jit

        ctx = Context(self.device, self.opset, self._uploaded, {})
        tensors = [v if isinstance(v, Tensor) else ctx.tensor(np.asarray(v))
                   for v in (values[name] for name in self.inputs)]
        key = tuple((t.shape, t.dtype, t.device) for t in tensors)
        replay = self._jits.get(key)
        if replay is None:
            replay = self._jits[key] = jit(self._outputs)
        if replay is _EAGER:
            return None
        try:
            outs = replay(*tensors)
        except (JitError, _HostOutput):
            self._jits[key] = _EAGER
            return None
        return dict(zip(self.outputs, outs))

    def _outputs(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        env = self.run(dict(zip(self.inputs, tensors)))
        outs = tuple(env[name] for name in self.outputs)
        if not all(isinstance(out, Tensor) for out in outs):
            raise _HostOutput
        return outs

    def bind(self, args: tuple, named: dict) -> dict[str, Any]:
        """The graph inputs by name, from positional and keyword arguments."""
        if len(args) > len(self.inputs):
            raise TypeError(f"the model takes {len(self.inputs)} inputs ({self.inputs}); "
                            f"got {len(args)} positional arguments")
        values = dict(zip(self.inputs, args)) | named
        unknown = sorted(set(values) - set(self.inputs))
        missing = [n for n in self.inputs if n not in values]
        if unknown or missing:
            raise TypeError(f"the model's inputs are {self.inputs}; "
                            f"missing {missing}, unknown {unknown}")
        return values

    def run(self, values: dict[str, Any], upto: int | None = None,
            outer: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every value the graph computes from `values` (the first `upto` nodes only, if given),
        as numpy arrays (host values) or Tensors. `outer` is the enclosing graph's values, for
        a subgraph (a branch or loop body): there, host values stay on the host."""
        ctx = Context(self.device, self.opset, self._uploaded,
                      {id(v): v for v in self.constants.values()})
        env: dict[str, Any] = dict(outer or {}) | dict(self.constants)
        env[""] = None
        ctx.scope = env
        for name, value in values.items():
            keep = isinstance(value, Tensor) or outer is not None and isinstance(
                value, np.ndarray)
            env[name] = value if keep else ctx.tensor(np.asarray(value))
        for index, node in enumerate(self.nodes[:upto]):
            args = [env[name] for name in node.inputs]
            if not node.graphs and all(a is None or isinstance(a, np.ndarray) for a in args):
                results = self._on_host(index, node, args)
            else:
                results = OPS[node.op](ctx, NodeArgs(node.attrs, args, len(node.outputs)))
            env.update(zip(node.outputs, results))
        return env

    def _on_host(self, index: int, node: Node, args: list) -> list[np.ndarray]:
        if index not in self._host:
            self._host[index] = _node_evaluator(node, args, self.opset)
        return _run_on_host(self._host[index], node, args)


def _run_on_host(evaluator: Any, node: Node, args: list) -> list[np.ndarray | None]:
    """The node's outputs in order (None for an omitted optional one)."""
    feeds = {name: a for name, a in zip(node.inputs, args) if name and a is not None}
    results = iter(evaluator.run(None, feeds))
    return [next(results) if name else None for name in node.outputs]


def load(model: str | Path | Any, device: str | None = None, warm: bool = False) -> Model:
    """Reads an ONNX model (a path or a ModelProto) for `device` (default: PORTKIT_DEVICE);
    with `warm`, builds every kernel now by running it once on zeros (portkit.onnx.warm).

    Raises UnsupportedModel naming every op (and attribute value) portkit cannot run, and
    InvalidModel naming the node where the graph is malformed (see portkit/onnx/validate.py)."""
    onnx = _onnx()
    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    proto = model if path is None else validate.read(path)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    _check_supported(proto.graph.node)
    validate.check(proto)
    loaded = _from_graph(proto.graph, opset, device)
    if warm:
        from portkit.onnx.warm import warm_up

        warm_up(loaded, proto.graph)
    return loaded


def _from_graph(graph: Any, opset: int, device: str | None) -> Model:
    """The Model of a GraphProto: the main graph, or a subgraph (whose nodes may read the
    enclosing graph's values by name)."""
    onnx = _onnx()
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    nodes = []
    for i, n in enumerate(graph.node):
        attrs = {a.name: _attribute(a) for a in n.attribute}
        subgraphs = {k: _from_graph(v, opset, device) for k, v in attrs.items()
                     if isinstance(v, onnx.GraphProto)}
        nodes.append(Node(n.op_type, n.name or f"{n.op_type}_{i}", tuple(n.input),
                          tuple(n.output), attrs | subgraphs, n, bool(subgraphs)))
    nodes = quantize.fused(nodes, constants)
    inputs = [i.name for i in graph.input if i.name not in constants]
    output_dtypes = {o.name: onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type)
                     for o in graph.output if o.type.tensor_type.elem_type}
    kept = []
    for node in nodes:   # constant folding: what depends on constants alone runs once, here
        args = [constants.get(name) for name in node.inputs]
        if not node.graphs and all(name in constants or not name for name in node.inputs):
            outputs = _run_on_host(_node_evaluator(node, args, opset), node, args)
            constants.update(zip(node.outputs, outputs))
        else:
            kept.append(node)
    return Model(kept, inputs, [o.name for o in graph.output], output_dtypes, constants, opset,
                 device)


def _check_supported(nodes: Iterable[Any]) -> None:
    missing: dict[str, int] = {}
    _count_missing(nodes, missing)
    if missing:
        listed = ", ".join(f"{op} x{count}" for op, count in sorted(missing.items()))
        raise UnsupportedModel(f"portkit cannot run these ONNX ops: {listed}. See docs/onnx.md "
                               "for what is supported; a missing op is a composition of Tensor "
                               "ops in portkit/onnx/ops.py")


def _count_missing(nodes: Iterable[Any], missing: dict[str, int]) -> None:
    """Adds to `missing` each op (or op and attribute) portkit cannot run, with its count,
    in these nodes and in their branches and loop bodies."""
    for node in nodes:
        for attribute in node.attribute:
            for graph in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                _count_missing(graph.node, missing)
        if node.domain not in DOMAINS:
            key = f"{node.domain}.{node.op_type}"
        elif node.op_type not in OPS:
            key = node.op_type
        else:
            check = CHECKS.get(node.op_type)
            reason = check and check({a.name: _attribute(a) for a in node.attribute},
                                     len(node.output))
            if not reason:
                continue
            key = f"{node.op_type} ({reason})"
        missing[key] = missing.get(key, 0) + 1


def _attribute(attribute: Any) -> Any:
    onnx = _onnx()
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def node_model(node: Any, values: dict[str, np.ndarray], opset_imports: Iterable[Any]
               ) -> tuple[Any, dict[str, np.ndarray]]:
    """A model of the NodeProto `node` alone, its inputs the graph inputs (dtypes and shapes
    from `values`, by name), with these opsets; and its feeds."""
    helper = _onnx().helper
    feeds = {name: np.asarray(values[name]) for name in node.input if name}
    graph = helper.make_graph(
        [node], f"{node.op_type}_alone",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    return helper.make_model(graph, opset_imports=list(opset_imports)), feeds


def _node_evaluator(node: Node, args: list, opset: int):
    """An onnx.reference evaluator for one node with the model's opset."""
    from onnx.reference import ReferenceEvaluator

    values = {name: a for name, a in zip(node.inputs, args) if name and a is not None}
    model, _ = node_model(node.proto, values, [_onnx().helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model)
