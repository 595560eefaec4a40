"""A model's kernels built at load time (`portkit.onnx.load(..., warm=True)`): the model runs
once on zeros of its declared input shapes, so that its first real call only launches. The
kernels compile in batches (Runtime.compile_all), shown as a bar on a terminal and as plain
progress lines in a log."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from portkit.abi.errors import PortkitError
from portkit.runtime import progress

if TYPE_CHECKING:
    from portkit.onnx import Model


class UndeclaredShape(PortkitError, ValueError):
    """A graph input whose shape the model does not fix, so it cannot be warmed up."""


def declared_zeros(graph: Any, names: list[str]) -> dict[str, np.ndarray]:
    """Zeros of each graph input in `names`, in its declared dtype and shape. Raises
    UndeclaredShape naming an input whose shape has a symbolic or missing dimension."""
    from onnx import helper

    found = {value.name: value.type.tensor_type for value in graph.input}
    zeros = {}
    for name in names:
        tensor = found[name]
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in tensor.shape.dim]
        if not tensor.HasField("shape") or any(isinstance(d, str) for d in dims):
            raise UndeclaredShape(
                f"warm=True needs every input's shape; input {name!r} has dims {dims}: load "
                "with warm=False and call the model once on a real input, or fix its dims "
                "(onnx.tools.update_model_dims)")
        zeros[name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    return zeros


def warm_up(model: Model, graph: Any) -> None:
    """Runs `model` once on zeros of `graph`'s declared input shapes, showing how many of its
    kernels have compiled."""
    zeros = declared_zeros(graph, model.inputs)
    with progress.shown(f"compiling {graph.name or 'the model'}'s kernels") as show, \
            progress.reporting(show):
        model(**zeros)
