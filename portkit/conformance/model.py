"""Conformance of a vendor's own ONNX model, and the first node where it diverges.

    portkit conform --backend NAME --model FILE.onnx [--inputs FILE.npz]

The model runs on the backend and on the CPU reference (and through onnxruntime, or
onnx.reference without it, as a check of the reference itself). Each graph output is one case,
judged as tier 5 judges a model: max|q - q_ref| <= 2 (U eps + gamma_n) max|q_ref|, with U the
rounding units of the kernels the backend runs for it, n its longest sum, and the 2 because the
float32 reference rounds too (a max, min or argmax adds no sum term: `sum_length`). When an
output fails, or a node's value inside the graph leaves the bound, every node is run alone on
the backend with the reference's values of its inputs, in graph order, and the first whose
output leaves its own bound is named: its op, attributes and input shapes, and a replay
command for that one node.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from portkit.abi import dtypes
from portkit.conformance.case import Case, Result, Status
from portkit.conformance.suite import Options, Report
from portkit.conformance.target import Target
from portkit.conformance.tensor_ops import gamma
from portkit.conformance.tier4_tensor import machine_eps, rounding_units, stack_device
from portkit.onnx.ops import Context

TIER = 8            # after the built-in tiers: it runs a file of the vendor's, not ours
NAME = "model"
_to_host = Context.host     # a Tensor read back, a host value as it is


@dataclass
class Divergence:
    """The first node whose output leaves its bound when it runs alone on reference inputs."""

    index: int
    op: str
    name: str
    attributes: dict[str, Any]
    input_shapes: list[tuple[int, ...] | None]
    error: float
    bound: float
    replay: str = ""
    files: list[str] = field(default_factory=list)

    def describe(self) -> str:
        shapes = ", ".join("-" if s is None else "x".join(map(str, s)) or "scalar"
                           for s in self.input_shapes)
        attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(self.attributes.items()))
        return (f"first diverging node: #{self.index} {self.op} '{self.name}' "
                f"({attrs or 'no attributes'}) on inputs of shape {shapes}: max |error| "
                f"{self.error:.4g} > bound {self.bound:.4g}")


def example_inputs(proto: Any, inputs: str | Path | None = None, seed: int = 0
                   ) -> dict[str, np.ndarray]:
    """The graph inputs: from an .npz file (by input name), else random ones of the declared
    dtypes and shapes (a dynamic dimension is 1)."""
    import onnx

    initialized = {i.name for i in proto.graph.initializer}
    wanted = [i for i in proto.graph.input if i.name not in initialized]
    if inputs is not None:
        with np.load(inputs) as data:
            missing = [i.name for i in wanted if i.name not in data]
            if missing:
                raise ValueError(f"{inputs} lacks the model inputs {missing}; save them with "
                                 "np.savez(path, **{name: array})")
            return {i.name: data[i.name] for i in wanted}
    rng = np.random.default_rng(seed)
    values = {}
    for value in wanted:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype.kind == "f":
            values[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            values[value.name] = rng.random(shape) < 0.5
        else:
            values[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return values


def check(target: Target, path: str | Path, inputs: str | Path | None = None,
          options: Options | None = None, reference: str = "cpu") -> Report:
    """Runs the model at `path` on `target` and on `reference`; one result per graph output."""
    from portkit.onnx import load
    from portkit.onnx.validate import read

    options = dataclasses.replace(options or Options(), tiers=(TIER,))
    start = time.perf_counter()
    proto = read(Path(path))
    values = example_inputs(proto, inputs, options.seed)
    device = stack_device(target)
    ours, theirs = load(proto, device=device), load(proto, device=reference)
    got = ours.run(dict(values))
    want = theirs.run(dict(values))
    oracle = _oracle(proto, values)
    report = Report(target.name, target.capabilities, options,
                    tiers={NAME: {"tier": TIER, "status": "run", "reason": "", "cases": 0}})
    longest = _longest(proto)
    units = {name: _units(got[name]) for name in ours.outputs}   # before any read-back
    # the search also starts when a node's value leaves its bound inside the graph, even if
    # the outputs keep theirs (a later node may hide the error: a max, a threshold)
    drifted = _drifted(ours, got, want, longest)
    searched, divergence = False, None
    for name in ours.outputs:
        case = Case(f"model/{Path(path).stem}/{name}", TIER, op="model")
        expected = _to_host(want[name])
        error, bound = _distance(got[name], expected, units[name], longest)
        result = Result(case, Status.PASSED, max_error=error)
        if (not error <= bound or drifted) and not searched:
            divergence = first_divergence(proto, device, reference, want,
                                          Path(options.repro_dir), target.name)
            searched = True
        where = divergence.describe() if divergence else (
            "no single node leaves its bound: the error builds up along the graph")
        if not error <= bound:
            result.message = f"max |error| {error:.4g} > bound {bound:.4g}; {where}"
        elif divergence:
            result.message = (f"max |error| {error:.4g} <= bound {bound:.4g}, but a node "
                              f"leaves its own bound; {where}")
        if result.message:
            result.status = Status.FAILED
            result.replay = divergence.replay if divergence else None
        if name in oracle:
            result.message += (f"{'; ' if result.message else ''}reference vs {oracle[name][0]}: "
                               f"max |error| {_max_abs(expected, oracle[name][1]):.4g}")
        report.results.append(result)
    report.tiers[NAME]["cases"] = len(report.results)
    report.seconds = time.perf_counter() - start
    return report


def _drifted(model: Any, got: dict[str, Any], want: dict[str, Any], longest: int
             ) -> bool:
    """True if some node's output, as the whole graph computed it, is farther from the
    reference's than its bound (U of every kernel behind it, the model's longest sum)."""
    names = [o for node in model.nodes for o in node.outputs
             if o and got.get(o) is not None and want.get(o) is not None]
    units = {name: _units(got[name]) for name in names}   # before a read-back realizes them
    for name in names:
        error, bound = _distance(got[name], _to_host(want[name]), units[name], longest)
        if not error <= bound:
            return True
    return False


def first_divergence(proto: Any, device: str, reference: str, values: dict[str, Any],
                     repro_dir: Path, backend: str) -> Divergence | None:
    """The first node that, run alone on `device` with the reference's `values` of its inputs,
    leaves its bound; its single-node model and inputs are written to `repro_dir`."""
    from portkit.onnx import load, node_model

    reference_values = {k: _to_host(v) for k, v in values.items() if v is not None}
    for index, node in enumerate(proto.graph.node):
        if node.op_type in ("Constant", "Shape", "Size"):
            continue
        single, feeds = node_model(node, reference_values, proto.opset_import)
        got = load(single, device=device).run(dict(feeds))
        for output in node.output:
            if output not in reference_values or not output:
                continue
            expected = reference_values[output]
            units = _units(got[output])
            error, bound = _distance(got[output], expected, units, _longest(single))
            if error <= bound:
                continue
            attributes = {a.name: _plain(a) for a in node.attribute}
            found = Divergence(index, node.op_type, node.name or output, attributes,
                               [None if not i else tuple(np.shape(reference_values.get(i)))
                                for i in node.input], error, bound)
            stem = f"node{index}-{node.op_type}"
            repro_dir.mkdir(parents=True, exist_ok=True)
            model_file, inputs_file = repro_dir / f"{stem}.onnx", repro_dir / f"{stem}.npz"
            model_file.write_bytes(single.SerializeToString())
            np.savez(inputs_file, **feeds)
            found.files = [str(model_file), str(inputs_file)]
            found.replay = (f"portkit conform --backend {backend} --model {model_file} "
                            f"--inputs {inputs_file}")
            return found
    return None


def _oracle(proto: Any, values: dict[str, np.ndarray]) -> dict[str, tuple[str, np.ndarray]]:
    """The outputs by onnxruntime, else onnx.reference; {} if neither can run the model."""
    try:
        import onnxruntime

        session = onnxruntime.InferenceSession(proto.SerializeToString())
        outputs, name = session.run(None, values), "onnxruntime"
    except Exception:  # noqa: BLE001 - not installed, or it rejects the model: try the next
        try:
            from onnx.reference import ReferenceEvaluator

            outputs, name = ReferenceEvaluator(proto).run(None, values), "onnx.reference"
        except Exception:  # noqa: BLE001 - an oracle is a bonus, never the verdict
            return {}
    return {o.name: (name, np.asarray(v)) for o, v in zip(proto.graph.output, outputs)}


def _units(value: Any) -> float:
    """U of the kernels a backend value came from (0 for a host value: it is exact)."""
    from portkit.tensor import Tensor

    return rounding_units(value.schedule()) if isinstance(value, Tensor) else 0.0


def _distance(value: Any, expected: np.ndarray, units: float, longest: int
              ) -> tuple[float, float]:
    """(max |value - expected|, the bound it must keep)."""
    actual = _to_host(value)
    if actual.shape != expected.shape:
        return float("inf"), 0.0
    if expected.dtype.kind not in "fc" and actual.dtype.kind not in "fc":
        return float(np.abs(actual.astype(np.int64) - expected.astype(np.int64)).max(
            initial=0)), 0.0
    eps = machine_eps(dtypes.float32 if expected.dtype.itemsize >= 4 else
                      dtypes.from_numpy(expected.dtype))
    scale = float(np.nanmax(np.abs(expected), initial=0.0)) if expected.size else 0.0
    bound = 2 * (max(units, 1) * eps + gamma(longest, eps)) * max(scale, np.finfo(
        np.float32).tiny)
    return _max_abs(actual, expected), bound


def _max_abs(actual: np.ndarray, expected: np.ndarray) -> float:
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    same = (a == e) | (np.isnan(a) & np.isnan(e))
    return float(np.where(same, 0.0, np.abs(a - e)).max(initial=0.0))


def _longest(proto: Any) -> int:
    """The longest sum any node of the model computes (see `sum_length`); 1 when shapes are
    unknown. A bound, not an exact count."""
    import onnx

    shapes = _shapes(proto)
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    return max((sum_length(node, shapes, constants, opset) for node in proto.graph.node),
               default=1)


# reductions that pick an element: they round nothing
_PICKS = ("ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "GlobalMaxPool", "MaxPool")


def sum_length(node: Any, shapes: dict[str, tuple[int, ...]], constants: dict[str, np.ndarray],
               opset: int) -> int:
    """The number of terms of the longest sum `node` computes: K of a matrix product, C kh kw
    of a convolution, the reduced extent (only the reduced axes) of a summing reduction,
    softmax or normalization; 1 for an op that sums nothing, a max, min or argmax (they add no
    rounding), or unknown shapes."""
    import onnx

    first = shapes.get(node.input[0]) if node.input else None
    if first is None or node.op_type in _PICKS:
        return 1
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    op, rank = node.op_type, len(first)

    def extent(axes: Any) -> int:
        return prod(first[a] for a in {int(a) % rank for a in axes}) if rank else 1

    if op in ("MatMul", "Gemm") and first:
        return first[0] if attrs.get("transA") and rank == 2 else first[-1]
    if op == "Conv" and rank > 2:
        weight = shapes.get(node.input[1])
        return prod(weight[1:]) if weight else prod(first[1:])
    if op.startswith("Reduce"):
        axes = attrs.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            axes = constants.get(node.input[1])
            if axes is None:        # axes computed at run time: assume all of them
                return prod(first)
        if axes is None or not len(axes):
            return 1 if attrs.get("noop_with_empty_axes") else prod(first)
        return extent(axes)
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = attrs.get("axis", -1 if opset >= 13 else 1) % max(rank, 1)
        return first[axis] if opset >= 13 else prod(first[axis:])
    if op in ("LayerNormalization", "RMSNormalization"):
        return prod(first[attrs.get("axis", -1) % max(rank, 1):])
    if op in ("InstanceNormalization", "GlobalAveragePool", "GlobalLpPool"):
        return prod(first[2:])
    if op == "GroupNormalization":
        return prod(first[1:]) // max(attrs.get("num_groups", 1), 1)
    if op == "LpNormalization":
        return extent([attrs.get("axis", -1)])
    if op == "MeanVarianceNormalization":
        return extent(attrs.get("axes", [0, 2, 3]))
    if op in ("AveragePool", "LpPool"):
        return prod(attrs.get("kernel_shape", [1]))
    return 1


def _shapes(proto: Any) -> dict[str, tuple[int, ...]]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - shapes only tighten the bound; without them it is loose
        inferred = proto
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    for init in inferred.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def _plain(attribute: Any) -> Any:
    import onnx

    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return f"tensor{list(value.dims)}"
    return value
