"""portkit: bring a new accelerator to a full deep-learning stack by implementing a small ABI.

A backend implements portkit.abi; portkit.backends finds the installed ones; `portkit backends`
and `portkit conform` tell you which work here and how well. The Tensor front end is
`portkit.Tensor`, with `portkit.nn`, `portkit.optim` and `portkit.amp` (mixed precision).
"""
import importlib

__version__ = "0.1.0"

# The stack is imported on first use, so a backend that imports portkit.abi does not pay for it.
__all__ = [
    "DTypeLike",
    "Tensor",
    "__version__",
    "amp",
    "autocast",
    "bfloat16",
    "bool_",
    "cat",
    "dtypes",
    "einsum",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "int8",
    "int16",
    "int32",
    "int64",
    "jit",
    "meshgrid",
    "nn",
    "no_grad",
    "optim",
    "profile",
    "promote",
    "realize",
    "seed",
    "stack",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]
_STACK = frozenset(__all__) - {"__version__", "amp", "dtypes", "jit", "nn", "optim", "profile"}


def __getattr__(name: str):
    if name in ("amp", "jit", "nn", "optim"):
        return importlib.import_module(f"portkit.{name}")
    if name == "profile":
        return importlib.import_module("portkit.runtime.profile").profile
    if name == "dtypes":
        return importlib.import_module("portkit.tensor.dtype_names")
    if name in _STACK:
        return getattr(importlib.import_module("portkit.tensor"), name)
    raise AttributeError(f"module 'portkit' has no attribute {name!r}")
