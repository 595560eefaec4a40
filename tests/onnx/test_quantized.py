"""QDQ models (onnxruntime.quantization.quantize_static: int8 weights per output channel,
uint8 activations): each Conv between DequantizeLinear nodes runs as an integer conv
(quantize.fused), on the matrix unit where the host has VNNI, and agrees with onnxruntime's
own int8 run of the model to one quantization step of the output."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

from onnx import TensorProto, helper, numpy_helper

import portkit.onnx
from portkit.abi import Op, dtypes
from portkit.onnx import quantize
from portkit.reference_backends.cpu import runtime as cpu_runtime
from portkit.reference_backends.cpu.renderer import DPBUSD


def _float_model(rng: np.random.Generator):
    """input (1, 3, 20, 20) -> Conv 3x3 pad 1 (3 -> 16, the stem's 3 channels) -> Relu ->
    Conv 3x3 stride 2 (16 -> 32) -> Relu -> Conv 3x3 pad 1 (32 -> 16) -> output."""
    def conv(name, x, cout, cin, k, **attrs):
        w = numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype(np.float32)
                                    * 0.3, name + ".w")
        b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1,
                                    name + ".b")
        return [w, b], helper.make_node("Conv", [x, w.name, b.name], [name], **attrs)
    inits, nodes = [], []
    for args, relu in ((("c1", "input", 16, 3, 3), True), (("c2", "r1", 32, 16, 3), True),
                       (("c3", "r2", 16, 32, 3), False)):
        attrs = {"pads": [1, 1, 1, 1]} if args[0] == "c1" else (
            {"strides": [2, 2]} if args[0] == "c2" else {"pads": [1, 1, 1, 1]})
        made, node = conv(*args, **attrs)
        inits += made
        nodes.append(node)
        if relu:
            nodes.append(helper.make_node("Relu", [args[0]], ["r" + args[0][1]]))
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                     [1, 3, 20, 20])],
        [helper.make_tensor_value_info("c3", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.fixture(scope="module", params=["uint8", "int8"])
def models(tmp_path_factory, request):
    """The float model and its QDQ quantization, with uint8 or int8 activations."""
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("qdq")
    plain, quantized = folder / "float.onnx", folder / "int8.onnx"
    onnx.save(_float_model(rng), plain)
    activations = {"uint8": quantization.QuantType.QUInt8,
                   "int8": quantization.QuantType.QInt8}[request.param]

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"input": rng.standard_normal((1, 3, 20, 20)).astype(
                np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)
    quantization.quantize_static(
        str(plain), str(quantized), Reader(), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, activation_type=activations,
        weight_type=quantization.QuantType.QInt8)
    return plain, quantized


def _output_step(path) -> float:
    """The scale of the QuantizeLinear that makes the model's output."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    return float(inits[last.input[1]])


def test_qdq_convs_run_in_integers_and_agree_with_onnxruntime(models):
    _, quantized = models
    model = portkit.onnx.load(quantized, device="cpu")
    assert [n.op for n in model.nodes].count(quantize.INTEGER_CONV) == 3
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    step = _output_step(quantized)
    for seed in range(3):
        x = np.random.default_rng(10 + seed).standard_normal((1, 3, 20, 20)).astype(np.float32)
        got = model(input=x)["c3"]
        expected = session.run(None, {"input": x})[0]
        # the same integers but where a rounding to an activation's step falls the other way
        assert np.abs(got - expected).max() <= step * 1.01
        assert np.mean(np.abs(got - expected) < step / 2) >= 0.95


@pytest.mark.skipif("avx512_vnni" not in cpu_runtime.cpu_flags(),
                    reason="the host has no AVX-512 VNNI")
def test_the_integer_convs_run_on_the_unit(models, monkeypatch):
    from portkit import runtime
    from portkit.graph import GraphOp
    from portkit.schedule import runner

    lowered, lower = [], runner.lower

    def spy(root, inputs, *args, **named):
        kernel = lower(root, inputs, *args, **named)
        lowered.append((kernel, inputs))
        return kernel
    runtime.clear()         # every kernel is lowered again
    monkeypatch.setattr(runner, "lower", spy)
    _, quantized = models
    model = portkit.onnx.load(quantized, device="cpu")
    model.replays = False
    model(input=np.zeros((1, 3, 20, 20), np.float32))
    on_unit = [inputs for kernel, inputs in lowered
               if any(n.op is Op.MMA and n.arg == DPBUSD for n in kernel.nodes)]
    # every conv (the stem's 3 channels taken as 4), each reading its input uint8 and laid
    # out channels last: c3's, 32 channels of 9 x 9 padded by 1
    assert len(on_unit) == 3
    assert any(x.op is GraphOp.LOAD and x.dtype == dtypes.uint8 and x.shape == (1, 11, 11, 32)
               for x in on_unit[-1])
    # which was padded from c2's quantized output, realized on its own (read by whatever
    # else reads it, a residual's Add, instead of computed again there), and c2's float
    # output before it
    buffers = {(x.dtype, x.shape) for _, inputs in lowered for x in inputs}
    assert {(dtypes.uint8, (1, 32, 9, 9)), (dtypes.float32, (1, 32, 9, 9))} <= buffers


def test_patterns_it_does_not_take_keep_the_float_conv(models):
    plain, quantized = models
    assert quantize.INTEGER_CONV not in [n.op for n in portkit.onnx.load(plain).nodes]
    # weights with a zero point other than 0 are left to the float path
    model = onnx.load(quantized)
    for init in model.graph.initializer:
        if init.name.endswith("weight_zero_point") or ".w_zero_point" in init.name:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + 1, init.name))
    loaded = portkit.onnx.load(model, device="cpu")
    assert quantize.INTEGER_CONV not in [n.op for n in loaded.nodes]
    x = np.random.default_rng(5).standard_normal((1, 3, 20, 20)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    difference = np.abs(loaded(input=x)["c3"] - session.run(None, {"input": x})[0])
    assert difference.max() <= _output_step(quantized) * 1.01


@pytest.mark.parametrize("dtype, zero", [(np.uint8, 131), (np.int8, -3), (np.int16, 700)])
def test_quantize_linear_rounds_ties_to_even_and_saturates_without_a_floor(dtype, zero):
    """QuantizeLinear on float32 rounds by adding and taking away 1.5 * 2^23 (`_rounded`):
    exact against the ONNX reference on ties and large values."""
    from onnx.reference import ReferenceEvaluator

    from portkit.tensor import Tensor

    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    graph = helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                       None)],
        [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
         numpy_helper.from_array(np.array(zero, dtype), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rng = np.random.default_rng(0)
    x = np.concatenate([np.arange(-300, 300, 0.25), rng.standard_normal(1000) * 1e5,
                        [4194304.75, -8388609.0, 1e9, -1e9]]
                       ).astype(np.float32)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    loaded = portkit.onnx.load(model, device="cpu")
    np.testing.assert_array_equal(loaded(x=x)["y"], expected)
    env = loaded.run({"x": Tensor(x, device="cpu")})
    assert not any(n.op is Op.TRUNC for k in env["y"].schedule() for n in k.nodes)


def _quantized_products(folder):
    """input (16, 128) -> MatMul (128 -> 64) -> Relu -> Gemm transB (64 -> 48, bias), in QDQ."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)
             for name, shape in (("w1", (128, 64)), ("w2", (48, 64)), ("b2", (48,)))]
    nodes = [helper.make_node("MatMul", ["input", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["out"], transB=1)]
    graph = helper.make_graph(
        nodes, "products",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [16, 128])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    plain, quantized = folder / "products.onnx", folder / "products-int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), plain)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"input": rng.standard_normal((16, 128)).astype(np.float32)}
                               for _ in range(8)])

        def get_next(self):
            return next(self.feeds, None)
    quantization.quantize_static(
        str(plain), str(quantized), Reader(), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8)
    return quantized


def test_qdq_matmul_and_gemm_run_in_integers_and_agree_with_onnxruntime(tmp_path):
    from portkit.tensor import Tensor

    quantized = _quantized_products(tmp_path)
    model = portkit.onnx.load(quantized, device="cpu")
    assert [n.op for n in model.nodes].count(quantize.INTEGER_MATMUL) == 2
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    step = _output_step(quantized)
    for seed in range(3):
        x = np.random.default_rng(20 + seed).standard_normal((16, 128)).astype(np.float32)
        difference = np.abs(model(input=x)["out"] - session.run(None, {"input": x})[0])
        assert difference.max() <= step * 1.01 and np.mean(difference < step / 2) >= 0.95
    if "avx512_vnni" in cpu_runtime.cpu_flags():
        env = model.run({"input": Tensor(np.zeros((16, 128), np.float32), device="cpu")})
        kernels = env["out"].schedule()
        assert sum(any(n.op is Op.MMA and n.arg == DPBUSD for n in k.nodes)
                   for k in kernels) == 2
