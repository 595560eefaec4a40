"""portkit.Tensor: a PyTorch-like, lazy tensor whose work reaches a device only as ABI kernels.

Operations build a graph (portkit/graph.py); `.realize()`, `.numpy()`, `.item()` and
`.tolist()` schedule and run it (portkit/schedule/). Only the primitives in
portkit/autograd.py touch the graph; every op composes them, so every op is differentiable
wherever its primitives are.

core.py holds the class; its methods are written by concern in creation.py, random.py,
elementwise.py, exponential.py, transcendental.py, movement.py, indexing.py, reduce.py and
functional_methods.py (which forwards to portkit.nn.functional); dtype.py and shapes.py read
the arguments; autocast_mode.py marks the ops portkit.autocast runs in a low precision or in
float32.
"""
from portkit.autograd import no_grad
from portkit.tensor.autocast_mode import autocast
from portkit.tensor.core import Tensor, from_dlpack, realize
from portkit.tensor.dtype import (
    DTypeLike,
    Scalar,
    bfloat16,
    bool_,
    default_float,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    promote,
    uint8,
    uint16,
    uint32,
    uint64,
)
from portkit.tensor.movement import cat, einsum, meshgrid, stack
from portkit.tensor.random import seed
from portkit.tensor.shapes import ShapeError

__all__ = ["DTypeLike", "Scalar", "ShapeError", "Tensor", "autocast", "bfloat16", "bool_", "cat",
           "default_float",
           "einsum", "float16", "float32", "float64", "from_dlpack", "int8", "int16", "int32",
           "int64", "meshgrid", "no_grad", "promote", "realize", "seed", "stack", "uint8",
           "uint16", "uint32", "uint64"]
