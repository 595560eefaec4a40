"""portkit.onnx.load refuses a malformed graph or file at load, with an error naming the node,
instead of a KeyError at the first call."""
from __future__ import annotations

import numpy as np
import pytest

from portkit.onnx import InvalidModel, load

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
helper = onnx.helper
F32 = onnx.TensorProto.FLOAT


def model(nodes, outputs=("y",)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [2])],
                              [helper.make_tensor_value_info(o, F32, [2]) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


BROKEN = {
    "an input nothing produces": (
        model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]),
        "node adder \\(Add\\) reads 'ghost', which no node, graph input or initializer"),
    "a cycle": (
        model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
               helper.make_node("Relu", ["a"], ["b"]), helper.make_node("Relu", ["a"], ["y"])]),
        "node first \\(Add\\) reads 'b', which node Relu computes later"),
    "an output no node produces": (model([helper.make_node("Relu", ["x"], ["a"])]),
                                   "graph output 'y' is produced by no node"),
    "a name produced twice": (model([helper.make_node("Relu", ["x"], ["y"]),
                                     helper.make_node("Neg", ["x"], ["y"])]),
                              "node Neg_1 \\(Neg\\) produces 'y', which is already"),
    "Cast to no dtype": (model([helper.make_node("Cast", ["x"], ["y"], to=999)]),
                         "node Cast_0 \\(Cast\\): attribute to=999 is not an ONNX dtype"),
    "an attribute the schema lacks": (model([helper.make_node("Neg", ["x"], ["y"], alpha=3.0)]),
                                      "node Neg_0 \\(Neg\\): Unrecognized attribute: alpha"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_graph_is_refused_at_load_naming_the_node(case):
    proto, named = BROKEN[case]
    with pytest.raises(InvalidModel, match=named):
        load(proto, device="cpu")


def test_a_dtype_attribute_out_of_range_is_found_inside_a_branch():
    branch = helper.make_graph([helper.make_node("Cast", ["x"], ["z"], to=-3, name="deep")],
                               "then", [], [helper.make_tensor_value_info("z", F32, [2])])
    cond = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph([cond], "g", [helper.make_tensor_value_info("x", F32, [2]),
                                            helper.make_tensor_value_info(
                                                "c", onnx.TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F32, [2])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModel, match="node deep \\(Cast\\): attribute to=-3"):
        load(proto, device="cpu")


@pytest.mark.parametrize("content, named", [(b"", "empty \\(0 bytes\\)"),
                                            (b"\xff\xfe not protobuf", "not an ONNX model")])
def test_an_empty_or_garbled_file_is_refused_at_load(tmp_path, content, named):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(InvalidModel, match=named):
        load(path, device="cpu")


def test_a_valid_file_still_loads_and_runs(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model([helper.make_node("Neg", ["x"], ["y"])]), str(path))
    got = load(path, device="cpu")(x=np.array([1.0, -2.0], np.float32))["y"]
    np.testing.assert_array_equal(got, [-1.0, 2.0])
