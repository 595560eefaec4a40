"""`portkit conform --model`: a vendor's ONNX model on their backend against the CPU reference,
and the first diverging node named when an op is broken."""
from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from portkit.conformance import Options, Status, Target, report
from portkit.conformance import model as model_conformance

onnx = pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
helper = onnx.helper


def sin_model(path):
    """x @ w -> Sin -> + b -> Relu -> ReduceSum: the Sin node is #1."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    axes = onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="project"),
             helper.make_node("Sin", ["h"], ["s"], name="wave"),
             helper.make_node("Add", ["s", "b"], ["a"], name="shift"),
             helper.make_node("Relu", ["a"], ["y"], name="clamp"),
             helper.make_node("ReduceSum", ["y", "axes"], ["total"], name="sum", keepdims=0)]
    graph = helper.make_graph(
        nodes, "sin_model", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                           ["batch", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("total", onnx.TensorProto.FLOAT, None)],
        initializer=[w, b, axes])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(proto, str(path))
    return path


def test_a_correct_backend_passes_every_output(tmp_path):
    path = sin_model(tmp_path / "m.onnx")
    result = model_conformance.check(Target.load("interpreter"), path,
                                     options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    assert [r.case.id for r in result.results] == ["model/m/y", "model/m/total"]
    assert all(r.status is Status.PASSED for r in result.results), result.results
    assert "reference vs onnxruntime" in result.results[0].message or \
        "reference vs onnx.reference" in result.results[0].message


def test_a_broken_sin_is_named_as_the_first_diverging_node(broken, tmp_path):
    path = sin_model(tmp_path / "m.onnx")
    repro = tmp_path / "repro"
    result = model_conformance.check(Target(broken.sin_off()), path,
                                     options=Options(tiers=(8,), repro_dir=str(repro)))
    failed = [r for r in result.results if r.status is Status.FAILED]
    assert failed and not result.ok
    for r in failed:
        assert "first diverging node: #1 Sin 'wave' (no attributes) on inputs of shape 1x16" \
            in r.message, r.message
        assert r.replay == (f"portkit conform --backend broken-sin --model {repro}/node1-Sin.onnx"
                            f" --inputs {repro}/node1-Sin.npz")
    # The replay files hold the Sin node alone, with the reference's input values.
    single = onnx.load(str(repro / "node1-Sin.onnx"))
    assert [n.op_type for n in single.graph.node] == ["Sin"]
    assert set(np.load(repro / "node1-Sin.npz")) == {"h"}
    # ... and that single node fails on the broken backend and passes on a correct one.
    again = model_conformance.check(Target(broken.sin_off()), repro / "node1-Sin.onnx",
                                    repro / "node1-Sin.npz", Options(tiers=(8,),
                                                                     repro_dir=str(tmp_path)))
    assert [r.status for r in again.results] == [Status.FAILED]
    fine = model_conformance.check(Target.load("interpreter"), repro / "node1-Sin.onnx",
                                   repro / "node1-Sin.npz")
    assert [r.status for r in fine.results] == [Status.PASSED]


def test_the_divergence_shows_in_every_report_format(broken, tmp_path, capsys):
    path = sin_model(tmp_path / "m.onnx")
    result = model_conformance.check(Target(broken.sin_off()), path,
                                     options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    report.write_json(result, tmp_path / "r.json")
    report.write_junit(result, tmp_path / "r.xml")
    report.write_html(result, tmp_path / "r.html")
    data = json.loads((tmp_path / "r.json").read_text())
    assert any("#1 Sin 'wave'" in c["message"] for c in data["cases"])
    failures = [f.get("message", "") + (f.text or "")
                for f in ET.parse(tmp_path / "r.xml").iter("failure")]
    assert failures and all("#1 Sin 'wave'" in f for f in failures)
    assert "#1 Sin 'wave'" in html.unescape((tmp_path / "r.html").read_text())
    from rich.console import Console

    report.print_terminal(result, Console(width=200))
    assert "#1 Sin 'wave'" in capsys.readouterr().out


def test_inputs_from_a_file_must_name_every_input(tmp_path):
    path = sin_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "bad.npz", y=np.ones(3))
    with pytest.raises(ValueError, match=r"lacks the model inputs \['x'\]"):
        model_conformance.check(Target.load("interpreter"), path, tmp_path / "bad.npz")


def test_conform_model_on_the_command_line(broken, fake_backends, tmp_path, capsys, monkeypatch):
    from portkit.cli import main

    monkeypatch.setenv("COLUMNS", "250")
    fake_backends({"broken-sin": "broken_backends:sin_backend",
                   "interpreter": "portkit.reference_backends.interpreter:backend",
                   "cpu": "portkit.reference_backends.cpu:backend"})
    path = sin_model(tmp_path / "m.onnx")
    code = main(["conform", "--backend", "broken-sin", "--model", str(path),
                 "--repro-dir", str(tmp_path / "repro"), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 1 and "first diverging node: #1 Sin 'wave'" in out
    assert json.loads((tmp_path / "r.json").read_text())["options"]["tiers"] == [8]
    replay = (f"--model {tmp_path}/repro/node1-Sin.onnx --inputs {tmp_path}/repro/node1-Sin.npz"
              f" --repro-dir {tmp_path}/replayed")
    assert main(["conform", "--backend", "interpreter", *replay.split()]) == 0
    assert main(["conform", "--backend", "broken-sin", *replay.split()]) == 1
    assert main(["conform", "--backend", "interpreter", "--model", str(tmp_path / "no.onnx")]) == 2
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert main(["conform", "--backend", "interpreter", "--model",
                 str(tmp_path / "empty.onnx")]) == 2
    assert "empty (0 bytes), not an ONNX model" in capsys.readouterr().out


def one_node_after(path, first: str, then: list, shape=(1, 8, 64, 64), opset=18):
    """x -> `first` (a node reading x, writing "a") -> the nodes `then` (ending in "y")."""
    nodes = [helper.make_node(*first) if isinstance(first, tuple) else first, *then]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
                     onnx.numpy_helper.from_array(np.array(-5, np.float32), "minus5")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]),
              str(path))
    return path


def test_a_max_reduction_adds_no_rounding_to_the_bound(broken, tmp_path):
    """A Sigmoid 0.2 % off after a ReduceMax over 8 of 8x64x64 elements: the bound counted
    every element as a sum term (gamma of 32768) and let it pass."""
    path = one_node_after(tmp_path / "m.onnx",
                          helper.make_node("ReduceMax", ["x", "axes"], ["a"], keepdims=0),
                          [helper.make_node("Sigmoid", ["a"], ["y"], name="squash")])
    result = model_conformance.check(Target(broken.division_high()), path,
                                     options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    [output] = result.results
    assert output.status is Status.FAILED, output.message
    assert "first diverging node: #1 Sigmoid 'squash'" in output.message
    fine = model_conformance.check(Target.load("interpreter"), path,
                                   options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    assert [r.status for r in fine.results] == [Status.PASSED]


def test_a_node_outside_its_bound_fails_even_when_a_later_node_hides_it(broken, tmp_path):
    """Sin 1e-3 off, then Relu(sin - 5) = 0 exactly: the output is right, the Sin is not."""
    path = one_node_after(tmp_path / "m.onnx", ("Sin", ["x"], ["a"], "wave"),
                          [helper.make_node("Add", ["a", "minus5"], ["b"]),
                           helper.make_node("Relu", ["b"], ["y"])], shape=(4, 16))
    result = model_conformance.check(Target(broken.sin_off()), path,
                                     options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    [output] = result.results
    assert output.max_error == 0 and output.status is Status.FAILED
    assert "but a node leaves its own bound; first diverging node: #0 Sin 'wave'" \
        in output.message
    fine = model_conformance.check(Target.load("interpreter"), path,
                                   options=Options(tiers=(8,), repro_dir=str(tmp_path)))
    assert [r.status for r in fine.results] == [Status.PASSED]


@pytest.mark.parametrize("node, opset, terms", [
    (helper.make_node("ReduceMax", ["x", "axes"], ["y"]), 18, 1),
    (helper.make_node("ArgMax", ["x"], ["y"], axis=1), 18, 1),
    (helper.make_node("ReduceSum", ["x", "axes"], ["y"]), 18, 8),
    (helper.make_node("ReduceSum", ["x"], ["y"]), 18, 8 * 64 * 64),
    (helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3]), 13, 64 * 64),
    (helper.make_node("Softmax", ["x"], ["y"]), 13, 64),
    (helper.make_node("Softmax", ["x"], ["y"], axis=2), 11, 64 * 64),
    (helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=1), 18, 8 * 64 * 64),
    (helper.make_node("Sigmoid", ["x"], ["y"]), 18, 1),
])
def test_a_nodes_sum_length_counts_only_what_it_sums(node, opset, terms):
    shapes = {"x": (1, 8, 64, 64)}
    constants = {"axes": np.array([1], np.int64)}
    assert model_conformance.sum_length(node, shapes, constants, opset) == terms
