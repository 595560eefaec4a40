"""ONNX Gather and GatherElements with indices from a graph input: a negative index counts from
the end once, and an index out of range raises IndexError (checked on the device)."""
import numpy as np
import pytest

from portkit import backends
from portkit.onnx import load

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
helper = onnx.helper
BACKENDS = [name for name, reason in backends.available().items() if reason is None]
TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)


def _model(op: str, index_shape: list[int], axis: int):
    table = onnx.numpy_helper.from_array(TABLE, "table")
    return helper.make_model(helper.make_graph(
        [helper.make_node(op, ["table", "i"], ["y"], axis=axis)], "g",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, index_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], initializer=[table]),
        opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("device", BACKENDS)
def test_gather_counts_a_negative_index_from_the_end_once(device):
    model = load(_model("Gather", [3], 0), device=device)
    got = model(i=np.array([-1, -4, 2], np.int64))["y"]
    np.testing.assert_array_equal(got, TABLE[[3, 0, 2]])
    for bad in (7, -9, 4, -5):       # -9 was normalized twice into row 3
        with pytest.raises(IndexError, match="Gather: .*dimension 0 with size 4"):
            model(i=np.array([0, bad, 1], np.int64))
    np.testing.assert_array_equal(model(i=np.array([1, 1, 0], np.int64))["y"], TABLE[[1, 1, 0]])


@pytest.mark.parametrize("device", BACKENDS)
def test_gather_elements_counts_a_negative_index_from_the_end_once(device):
    model = load(_model("GatherElements", [4, 2], 1), device=device)
    index = np.array([[0, -1], [2, -3], [-2, 1], [1, 0]], np.int64)
    got = model(i=index)["y"]
    np.testing.assert_array_equal(got, np.take_along_axis(TABLE, index % 3, 1))
    for bad in (3, -4):
        with pytest.raises(IndexError, match="GatherElements: .*dimension 1 with size 3"):
            model(i=np.where(index == 2, bad, index))
