"""portkit.onnx on real-shaped models made here (nothing downloaded): an MLP, a CNN with
conv/pool/batchnorm and a transformer block exported from PyTorch, and graphs built with
onnx.helper for opset differences, on every available backend, against onnxruntime."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from portkit import backends, schedule
from portkit.graph import GraphOp
from portkit.onnx import UnsupportedModel, load
from portkit.tensor import Tensor

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="pip install 'portkit[onnx]'")
torch = pytest.importorskip("torch", reason="the models are exported from PyTorch")
helper = onnx.helper
F32 = onnx.TensorProto.FLOAT

BACKENDS = [name for name, reason in backends.available().items() if reason is None]


def export(model, example: torch.Tensor, dynamic_batch: bool = False):
    """The ONNX model PyTorch's exporter writes for `model` (eval mode) at `example`."""
    kwargs = {"dynamic_shapes": ({0: torch.export.Dim("batch", min=1, max=64)},)} \
        if dynamic_batch else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model.eval(), (example,), dynamo=True, verbose=False,
                                    **kwargs)
    return program.model_proto


def onnxruntime(proto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(proto.SerializeToString()).run(None, inputs)


def models() -> dict:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
                              torch.nn.LogSoftmax(-1))
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.BatchNorm2d(16),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(16, 5))
    cnn[1].running_mean.uniform_(-0.5, 0.5)     # statistics that are not the identity
    cnn[1].running_var.uniform_(0.5, 2.0)
    block = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return {"mlp": (mlp, torch.randn(4, 64)), "cnn": (cnn, torch.randn(2, 3, 16, 16)),
            "transformer": (block, torch.randn(2, 7, 32))}


MODELS = models()


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request):
    model, example = MODELS[request.param]
    proto = export(model, example)
    feeds = {proto.graph.input[0].name: example.numpy()}
    return request.param, proto, feeds, onnxruntime(proto, feeds)


@pytest.mark.parametrize("device", BACKENDS)
def test_exported_models_agree_with_onnxruntime(exported, device):
    name, proto, feeds, want = exported
    got = list(load(proto, device=device)(**feeds).values())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name} on {device}")


def test_a_dynamic_batch_runs_at_any_size():
    model, example = MODELS["cnn"]
    proto = export(model, example, dynamic_batch=True)
    loaded = load(proto, device="cpu")
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), np.float32)
        want = onnxruntime(proto, {proto.graph.input[0].name: x})[0]
        np.testing.assert_allclose(loaded(x)[proto.graph.output[0].name], want, rtol=1e-4,
                                   atol=1e-5)


def test_tensors_in_give_tensors_out():
    proto = graph([helper.make_node("Relu", ["x"], ["y"])], {"x": [3]}, ["y"])
    out = load(proto, device="cpu")(x=Tensor([-1.0, 0.5, 2.0]))["y"]
    assert isinstance(out, Tensor) and out.tolist() == [0.0, 0.5, 2.0]


def test_pow_of_two_tensors_keeps_the_sign_of_minus_zero():
    """C's pow, as onnxruntime computes it: (-0) ** -1 is -inf and (-0) ** 3 is -0; the
    importer's own formula tested x < 0 and lost -0's sign."""
    proto = graph([helper.make_node("Pow", ["x", "y"], ["z"])], {"x": [6], "y": [6]}, ["z"])
    x = np.array([-0.0, -0.0, -2.0, 0.0, -8.0, 4.0], np.float32)
    y = np.array([-1.0, 3.0, 3.0, -2.0, 1 / 3, 0.5], np.float32)
    got = load(proto, device="cpu")(x=x, y=y)["z"]
    want = onnxruntime(proto, {"x": x, "y": y})[0]
    numbers = ~np.isnan(want)            # (-8) ** (1/3) is NaN, its sign bit unspecified
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def graph(nodes, inputs: dict[str, list[int]], outputs: list[str], opset: int = 13,
          initializers=()):
    """A float32 model of `nodes` with these inputs and outputs."""
    return helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, s)
                                       for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, F32, None) for n in outputs],
                          initializer=list(initializers)),
        opset_imports=[helper.make_opsetid("", opset)])


def ints(name: str, values: list[int]):
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


OPSET_PAIRS = {   # the same computation written for an older and a current opset
    "softmax over the flattened trailing axes, then over the last axis": (
        graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": [2, 3, 4]}, ["y"], 11),
        graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": [2, 3, 4]}, ["y"], 13)),
    "ReduceSum axes as an attribute, then as an input": (
        graph([helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)],
              {"x": [2, 3, 4]}, ["y"], 11),
        graph([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
              {"x": [2, 3, 4]}, ["y"], 13, [ints("axes", [1])])),
    "ReduceMean axes as an attribute, then as an input": (
        graph([helper.make_node("ReduceMean", ["x"], ["y"], axes=[0, 2])],
              {"x": [2, 3, 4]}, ["y"], 13),
        graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"])],
              {"x": [2, 3, 4]}, ["y"], 18, [ints("axes", [0, 2])])),
    "Unsqueeze and Squeeze axes as attributes, then as inputs": (
        graph([helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
               helper.make_node("Squeeze", ["u"], ["y"], axes=[0])], {"x": [2, 3]}, ["y"], 11),
        graph([helper.make_node("Unsqueeze", ["x", "a"], ["u"]),
               helper.make_node("Squeeze", ["u", "b"], ["y"])], {"x": [2, 3]}, ["y"], 13,
              [ints("a", [0, 3]), ints("b", [0])])),
    "Split sizes as an attribute, then as an input": (
        graph([helper.make_node("Split", ["x"], ["y", "z"], axis=1, split=[1, 3])],
              {"x": [2, 4]}, ["y", "z"], 11),
        graph([helper.make_node("Split", ["x", "s"], ["y", "z"], axis=1)],
              {"x": [2, 4]}, ["y", "z"], 13, [ints("s", [1, 3])])),
    "Clip bounds as attributes, then as inputs": (
        graph([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)],
              {"x": [5]}, ["y"], 6),
        graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": [5]}, ["y"], 13, [
            onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
            onnx.numpy_helper.from_array(np.array(0.5, np.float32), "hi")])),
}


@pytest.mark.parametrize("what", sorted(OPSET_PAIRS))
def test_opset_differences(what):
    old, new = OPSET_PAIRS[what]
    x = np.random.default_rng(0).standard_normal(
        [d.dim_value for d in old.graph.input[0].type.tensor_type.shape.dim], np.float32)
    for proto in (old, new):
        want = onnxruntime(proto, {"x": x})
        got = list(load(proto, device="cpu")(x).values())
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    if "softmax" in what:   # the two opsets really differ here
        assert not np.allclose(onnxruntime(old, {"x": x})[0], onnxruntime(new, {"x": x})[0])


def test_missing_ops_fail_at_load_with_the_list():
    proto = graph([helper.make_node("Det", ["x"], ["d"]),
                   helper.make_node("NonMaxSuppression", ["x", "x"], ["u"]),
                   helper.make_node("Det", ["x"], ["e"]),
                   helper.make_node("Conv", ["x", "x"], ["y"], kernel_shape=[1, 1, 1, 1])],
                  {"x": [2, 2]}, ["y"], 18, [])
    with pytest.raises(UnsupportedModel, match=r"Conv \(4-d and larger\) x1, Det x2, "
                                               r"NonMaxSuppression x1"):
        load(proto)


def test_fresh_input_arrays_are_read_on_every_call():
    # Each call's array may sit where the last call's freed one was (the same id): the
    # inputs must be uploaded again, not found in the cache of the model's constants.
    proto = graph([helper.make_node("Relu", ["x"], ["y"])], {"x": [4]}, ["y"], 18, [])
    model = load(proto, device="cpu")
    for i in range(6):
        assert model(x=np.full(4, float(i), np.float32))["y"][0] == i


def test_int64_indices_are_narrowed_where_exact():
    x = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "table")
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", F32, None)], initializer=[x]),
        opset_imports=[helper.make_opsetid("", 13)])
    for device in BACKENDS:
        got = load(proto, device=device)(i=np.array([2, -3], np.int64))["y"]
        np.testing.assert_array_equal(got, [[8, 9, 10, 11], [0, 1, 2, 3]])


def test_the_example_agrees_on_every_backend():
    example = Path(__file__).parents[2] / "examples" / "onnx_model.py"
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                          check=False, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    agreeing = [r.split("│")[1].strip() for r in rows if r.rstrip("│ ").endswith("True")]
    assert sorted(agreeing) == sorted(BACKENDS), done.stdout


@pytest.mark.parametrize("equation, shapes", [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]), ("...ij,jk", [(2, 3, 4), (4, 5)]),
    ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("bii->b", [(2, 3, 3)]), ("ij,jk", [(2, 3), (3, 4)]),
    ("i,i", [(5,), (5,)]), ("...ii->...i", [(2, 4, 4)]), ("iij,kj->ik", [(3, 3, 2), (4, 2)]),
])
def test_einsum_with_ellipses_diagonals_and_implicit_outputs(equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    proto = graph([helper.make_node("Einsum", names, ["y"], equation=equation)],
                  dict(zip(names, shapes)), ["y"], 12)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got = load(proto, device="cpu")(*values)["y"]
    np.testing.assert_allclose(got, np.einsum(equation, *values), rtol=1e-5, atol=1e-5)


def test_a_loaded_model_prints_a_summary_not_its_weights():
    weight = onnx.numpy_helper.from_array(np.full((300, 300), 0.125, np.float32), "W")
    proto = graph([helper.make_node("MatMul", ["x", "W"], ["y"]),
                   helper.make_node("Relu", ["y"], ["z"])], {"x": [1, 300]}, ["z"], 18,
                  [weight])
    shown = repr(load(proto, device="cpu"))
    assert shown == ("Model(opset=18, inputs=['x'], outputs=['z'], nodes=2 (MatMul 1, Relu 1), "
                     "constants=1 (90,000 values), device='cpu')")


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 0, 1, 1]])
def test_a_conv_transpose_of_stride_kernel_is_a_matmul_and_a_permute(pads):
    # a U-Net decoder's 2x2 stride-2 upsampling, as the spread conv it ran at 0.2 GFLOP/s
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 5, 6), np.float32)
    w, b = rng.standard_normal((8, 4, 2, 2), np.float32), rng.standard_normal(4, np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=pads)
    inits = [helper.make_tensor(n, F32, a.shape, a.ravel()) for n, a in (("w", w), ("b", b))]
    proto = graph([node], {"x": list(x.shape)}, ["y"], initializers=inits)
    model = load(proto, device="cpu")
    y = model.run(model.bind((Tensor(x),), {}))["y"]
    matmul, permute = schedule.create_schedule([y.lazy])
    assert matmul.root.op is GraphOp.REDUCE and matmul.root in permute.inputs
    np.testing.assert_allclose(y.numpy(), onnxruntime(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_convs_constant_weights_lie_along_the_output_channels():
    # a conv's weights [cout][cin][kh][kw] are uploaded [cin][kh][kw][cout], the way a packed
    # kernel's panel holds them: its copy is contiguous, not a transpose of the weights
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 10, 10), np.float32)
    w = rng.standard_normal((16, 8, 3, 3), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    proto = graph([node], {"x": list(x.shape)}, ["y"],
                  initializers=[helper.make_tensor("w", F32, w.shape, w.ravel())])
    model = load(proto, device="cpu")
    y = model.run(model.bind((Tensor(x),), {}))["y"]
    conv = schedule.create_schedule([y.lazy])[-1]
    assert (8, 3, 3, 16) in [i.shape for i in conv.inputs if i.op is GraphOp.LOAD]
    np.testing.assert_allclose(y.numpy(), onnxruntime(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)
