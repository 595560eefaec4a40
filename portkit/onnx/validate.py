"""Checks an ONNX model when it is loaded, so that a broken graph fails there, naming the node,
and never as a KeyError at the first call.

Checked here: an empty or garbled file; every node input is a graph input, an initializer, an
enclosing graph's value or an earlier node's output (so nodes are in topological order, with no
cycle); every name is produced once; every graph output is produced; dtype attributes (`Cast`'s
`to`, ...) name an ONNX dtype. `onnx.checker.check_node` checks each node against its schema
(attribute names and types, input and output counts). The whole-model `onnx.checker.check_model`
is not used: it refuses graph outputs declared without a shape, which onnxruntime and portkit
run, and its lexical scope for branches cannot be filled from Python.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from portkit.abi.errors import PortkitError

# attributes whose integer value is an ONNX TensorProto dtype code
DTYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype", "output_datatype", "stash_type",
                              "softmax_precision"})
_FIX = "fix the exporter, or the graph with onnx.helper"


class InvalidModel(PortkitError, ValueError):
    """The ONNX file or graph is malformed (not a model, a value no node produces, a cycle, an
    attribute out of range); raised by `portkit.onnx.load`, naming the node."""


def read(path: Path) -> Any:
    """The ModelProto in the file at `path`; InvalidModel if it is empty or not a model."""
    import onnx
    from google.protobuf.message import DecodeError

    if path.stat().st_size == 0:
        raise InvalidModel(f"{path} is empty (0 bytes), not an ONNX model: export or download "
                           "it again")
    try:
        return onnx.load(str(path))
    except DecodeError as error:
        raise InvalidModel(f"{path} is not an ONNX model ({error}): export or download it "
                           "again") from None


def check(proto: Any) -> None:
    """Raises InvalidModel naming the first node (or graph output) that makes `proto` invalid."""
    import onnx

    context = onnx.checker.C.CheckerContext()
    context.ir_version = proto.ir_version or onnx.IR_VERSION
    context.opset_imports = {o.domain: o.version for o in proto.opset_import}
    _check_graph(proto.graph, set(), context)


def _check_graph(graph: Any, outer: set[str], context: Any) -> None:
    """Checks `graph`, whose nodes may also read the names in `outer` (an enclosing graph's)."""
    import onnx

    known = outer | {v.name for v in graph.input} | {t.name for t in graph.initializer}
    later = {out: n for n in graph.node for out in n.output}
    codes = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
    for index, node in enumerate(graph.node):
        where = f"node {node.name or f'{node.op_type}_{index}'} ({node.op_type})"
        for name in node.input:
            if name and name not in known:
                raise InvalidModel(f"{where} reads {name!r}, which " + (
                    f"node {later[name].name or later[name].op_type} computes later: the nodes "
                    "are not in topological order, or form a cycle" if name in later else
                    "no node, graph input or initializer produces") + f"; {_FIX}")
        subgraphs = [g for a in node.attribute for g in [a.g] * a.HasField("g") + list(a.graphs)]
        try:
            if subgraphs:   # the checker cannot see the enclosing names: branches are walked here
                for attribute in node.attribute:
                    if not attribute.HasField("g") and not attribute.graphs:
                        onnx.checker.check_attribute(attribute, context)
            else:
                onnx.checker.check_node(node, context)
        except onnx.checker.ValidationError as error:
            raise InvalidModel(f"{where}: {' '.join(str(error).split())}; {_FIX}") from None
        for attribute in node.attribute:
            if (attribute.name in DTYPE_ATTRIBUTES
                    and attribute.type == onnx.AttributeProto.INT and attribute.i not in codes):
                raise InvalidModel(
                    f"{where}: attribute {attribute.name}={attribute.i} is not an ONNX dtype "
                    f"(onnx.TensorProto.DataType, {min(codes)} to {max(codes)}); {_FIX}")
        for subgraph in subgraphs:
            _check_graph(subgraph, known, context)
        for name in node.output:
            if name in known:
                raise InvalidModel(f"{where} produces {name!r}, which is already a graph input, "
                                   f"an initializer or another node's output; {_FIX}")
            known |= {name} - {""}
    for output in graph.output:
        if output.name not in known:
            raise InvalidModel(f"graph output {output.name!r} is produced by no node, graph "
                               f"input or initializer; {_FIX}")
