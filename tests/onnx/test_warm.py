"""`portkit.onnx.load(..., warm=True)`: every kernel of the model is built at load time, with
progress shown, so that the first call compiles nothing."""
from __future__ import annotations

import numpy as np
import pytest

from portkit import runtime
from portkit.onnx import load
from portkit.onnx.warm import UndeclaredShape

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
helper = onnx.helper
F32 = onnx.TensorProto.FLOAT


def cnn(batch: int | str = 2):
    """conv 3x3 -> relu -> global average pool -> flatten -> gemm, on 3x8x8 images."""
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4),
               "fc": rng.standard_normal((4, 5)), "fb": rng.standard_normal(5)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", F32, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F32, None)],
        [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_warm_builds_every_kernel_at_load(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    runtime.clear()
    rt = runtime.get("cpu")
    before = rt.builds
    model = load(cnn(), device="cpu", warm=True)
    built = rt.builds - before
    assert built >= 2
    lines = capsys.readouterr().err.splitlines()
    assert f"portkit: compiling cnn's kernels {built}/{built}" in lines
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    cold = load(cnn(), device="cpu")(x=x)["y"]
    assert rt.builds - before == built     # the first real call compiled nothing more
    np.testing.assert_allclose(model(x=x)["y"], cold, rtol=1e-5)


def test_warm_needs_declared_shapes():
    with pytest.raises(UndeclaredShape, match="input 'x' has dims \\['N', 3, 8, 8\\]"):
        load(cnn("N"), device="cpu", warm=True)
