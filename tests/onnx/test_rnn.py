"""portkit.onnx's recurrent layers (portkit/onnx/rnn.py): LSTM and GRU made with onnx.helper,
against onnxruntime, and the kernels their time loop compiles."""
from __future__ import annotations

import json

import numpy as np
import pytest

from portkit import graph, runtime
from portkit.abi.ops import Op
from portkit.onnx import load
from portkit.schedule import runner

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="pip install 'portkit[onnx]'")
helper = onnx.helper
F32 = onnx.TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3}


def recurrent(kind: str, steps: int, features: int = 3, hidden: int = 4, batch: int = 2):
    """One forward `kind` layer over `steps` steps, with random weights and bias."""
    rng = np.random.default_rng(0)
    gates = GATES[kind]
    weights = {"W": rng.standard_normal((1, gates * hidden, features)),
               "R": rng.standard_normal((1, gates * hidden, hidden)),
               "B": rng.standard_normal((1, 2 * gates * hidden))}
    node = helper.make_node(kind, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden)
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info("x", F32, [steps, batch, features])],
        [helper.make_tensor_value_info(n, F32, None) for n in ("y", "y_h")],
        [onnx.numpy_helper.from_array((v * 0.5).astype(np.float32), k)
         for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def lowered_kernels(monkeypatch, model, x: np.ndarray) -> list[str]:
    """The kernels a first call of `model` on cpu lowers (empty caches), each by its JSON
    form; checks the outputs against onnxruntime."""
    runtime.clear()
    kernels = []

    def lower(*args, **kwargs):
        kernel = real(*args, **kwargs)
        kernels.append(kernel.to_json())
        return kernel
    real = runner.lower
    monkeypatch.setattr(runner, "lower", lower)
    got = load(model, device="cpu")(x)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for name, w in zip(("y", "y_h"), want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)
    return kernels


def at_two_lengths(kind: str, seed: int, measure) -> list[int]:
    """`measure(model, x)` of a `kind` layer on random inputs of 5 and of 12 steps."""
    rng = np.random.default_rng(seed)
    return [measure(recurrent(kind, steps), rng.standard_normal((steps, 2, 3)).astype(np.float32))
            for steps in (5, 12)]


@pytest.mark.parametrize("kind", sorted(GATES))
def test_a_longer_sequence_compiles_no_more_kernels(monkeypatch, kind):
    # each step reads its inputs at a position that is a scalar argument, not code: one
    # step's kernels serve every step, so 12 steps lower as many kernels as 5
    def distinct(model, x):
        kernels = lowered_kernels(monkeypatch, model, x)
        assert len(kernels) == len(set(kernels))
        return len(kernels)
    counts = at_two_lengths(kind, 1, distinct)
    assert counts[0] == counts[1], f"{kind}: {counts[0]} kernels at 5 steps, {counts[1]} at 12"


def scheduled_exponentials(monkeypatch, model, x: np.ndarray) -> int:
    """The exponentials (one per sigmoid or tanh element-wise, each rounding x / ln2 to an
    integer k: a CAST from a float to an int) in every graph that a first call of `model` on
    cpu (empty caches) hands the scheduler: a graph replayed is not scheduled."""
    runtime.clear()
    found = []

    def schedule(outs):
        found.extend(n for n in graph.toposort(outs) if n.op is Op.CAST and n.src[0].dtype.is_float
                     and not n.dtype.is_float)
        return real(outs)
    real = runner.schedule
    monkeypatch.setattr(runner, "schedule", schedule)
    load(model, device="cpu")(x)
    return len(found)


@pytest.mark.parametrize("kind", sorted(GATES))
def test_a_longer_sequence_schedules_no_more_steps(monkeypatch, kind):
    # every step is realized on its own, and from the second on each has one graph
    # structure, which the runner replays: the scheduler sees two steps at any length
    counts = at_two_lengths(kind, 2, lambda model, x: scheduled_exponentials(monkeypatch, model, x))
    assert counts[0] > 0
    assert counts[0] == counts[1], (
        f"{kind}: the scheduler saw {counts[0]} exponentials at 5 steps, {counts[1]} at 12")


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_a_gru_step_linear_before_reset_is_one_product(monkeypatch, linear_before_reset):
    # torch's GRU (linear before reset) multiplies h by all three gates' weights: one product
    # of 3 x hidden rows a step, sliced, not one of 2 x hidden and one of hidden; reset
    # applied to h first needs its own second product
    model = recurrent("GRU", 6)
    model.graph.node[0].attribute.append(
        helper.make_attribute("linear_before_reset", linear_before_reset))
    x = np.random.default_rng(3).standard_normal((6, 2, 3)).astype(np.float32)
    names = [json.loads(k)["name"] for k in lowered_kernels(monkeypatch, model, x)]
    products = sorted(n for n in names if n.startswith("r_2_"))     # (batch, rows, 1)
    assert products == (["r_2_12_1"] if linear_before_reset else ["r_2_4_1", "r_2_8_1"]), names
