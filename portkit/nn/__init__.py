"""Layers with parameters, state dicts, and safetensors files (through the safetensors library).

A layer holds its parameters and calls portkit.nn.functional, where the computation lives.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from portkit.abi import dtypes
from portkit.nn import functional as F
from portkit.tensor import DTypeLike, Tensor, realize
from portkit.tensor.dtype import to_dtype

_DTYPE_NAMES = frozenset(d.name for d in dtypes.ALL)


class Module:
    """Base of layers: finds its parameters by walking attributes (tensors, modules, lists)."""

    training = True

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of this module and its children, by dotted name."""
        out: dict[str, Tensor] = {}
        for name, value in vars(self).items():
            _collect(value, prefix + name, out)
        return out

    def parameters(self) -> list[Tensor]:
        """The tensors that require gradients (what an optimizer updates)."""
        return [t for t in self.state_dict().values() if t.requires_grad]

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(dotted name, tensor) of each parameter, as torch's named_parameters()."""
        return [(n, t) for n, t in self.state_dict().items() if t.requires_grad]

    def zero_grad(self) -> None:
        """Drops every parameter's gradient (None, as torch's set_to_none default)."""
        for t in self.parameters():
            t.grad = None

    def load_state_dict(self, state: dict[str, Tensor | np.ndarray], strict: bool = True) -> None:
        """Copies values into this module's tensors; names and shapes must match."""
        own = self.state_dict()
        missing, unexpected = set(own) - set(state), set(state) - set(own)
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {sorted(missing)}, unexpected "
                           f"{sorted(unexpected)}")
        for name, value in state.items():
            if name not in own:
                continue
            array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
            if array.shape != own[name].shape:
                raise ValueError(f"load_state_dict: {name} has shape {own[name].shape}, the "
                                 f"state has {array.shape}")
            own[name].assign(Tensor(array, own[name].dtype, own[name].device))

    def to(self, device: str | DTypeLike | None = None, dtype: DTypeLike | None = None
           ) -> Module:
        """Moves every tensor to `device` and casts the float ones to `dtype` (either may come
        first, as torch's); the tensors stay the same objects, so optimizers keep them."""
        if device is not None and (not isinstance(device, str) or device in _DTYPE_NAMES):
            device, dtype = None, device
        dtype = to_dtype(dtype)
        moved = [t for t in self.state_dict().values()]
        moved += [t.grad for t in moved if t.grad is not None]
        for t in moved:
            value = Tensor(t.lazy)          # no autograd record: t stays a leaf
            if device is not None:
                value = value.to(device)
            if dtype is not None and value.dtype.is_float:
                value = value.cast(dtype)
            t.lazy = value.lazy
        realize(*moved)
        return self

    def train(self, mode: bool = True) -> Module:
        """Sets training mode (dropout active, batch statistics) here and in every child."""
        for module in [self, *_modules(self)]:
            module.training = mode
        return self

    def eval(self) -> Module:
        """train(False)."""
        return self.train(False)

    def __call__(self, *args, **kwargs) -> Tensor:
        return self.forward(*args, **kwargs)


def _collect(value, name: str, out: dict) -> None:
    # a module's tensors are found under its attribute's name, as torch names them
    if isinstance(value, Tensor):
        out[name] = value
    elif isinstance(value, Module):
        out.update(value.state_dict(name + "."))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _collect(item, f"{name}.{i}", out)


def _modules(module: Module) -> list[Module]:
    found = []
    for value in vars(module).values():
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, Module):
                found += [item, *_modules(item)]
    return found


def uniform_parameter(shape: tuple[int, ...], bound: float) -> Tensor:
    """A parameter drawn uniformly from [-bound, bound], as torch initializes its layers."""
    return (Tensor.rand(*shape) * (2 * bound) - bound).realize().requires_grad_()


class Linear(Module):
    """y = x @ weight.T + bias, initialized as torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = uniform_parameter((out_features, in_features), bound)
        self.bias = uniform_parameter((out_features,), bound) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class LayerNorm(Module):
    """Normalizes the last len(shape) dims, then scales and shifts."""

    def __init__(self, shape, eps: float = 1e-5, elementwise_affine: bool = True):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps = eps
        self.weight = Tensor.ones(*self.shape).contiguous().realize().requires_grad_() \
            if elementwise_affine else None
        self.bias = Tensor.zeros(*self.shape).contiguous().realize().requires_grad_() \
            if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        axes = tuple(range(-len(self.shape), 0))
        x = F.layernorm(x, axes, self.eps)
        return x if self.weight is None else x * self.weight + self.bias


class _BatchNorm(Module):
    """Batch normalization per channel (dim 1) over the other dims, with running statistics."""

    dims = 2

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        self.eps, self.momentum = eps, momentum
        self.weight = Tensor.ones(channels).contiguous().realize().requires_grad_()
        self.bias = Tensor.zeros(channels).contiguous().realize().requires_grad_()
        self.running_mean = Tensor.zeros(channels).contiguous().realize()
        self.running_var = Tensor.ones(channels).contiguous().realize()

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != self.dims + 2 and not (self.dims == 1 and x.ndim == 2):
            raise ValueError(f"{type(self).__name__} expects {self.dims + 2}-d input (N, C, "
                             f"...), got shape {x.shape}")
        out = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                           self.training, self.momentum, self.eps)
        if self.training:
            realize(self.running_mean, self.running_var)
        return out


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) input (torch.nn.BatchNorm1d)."""

    dims = 1


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) input (torch.nn.BatchNorm2d)."""

    dims = 2


class BatchNorm3d(_BatchNorm):
    """Batch normalization of (N, C, D, H, W) input (torch.nn.BatchNorm3d)."""

    dims = 3


class Embedding(Module):
    """A table of vectors looked up by integer index."""

    def __init__(self, count: int, dim: int, padding_idx: int | None = None):
        weight = Tensor.randn(count, dim)
        if padding_idx is not None:        # that row starts at 0 and never learns, as torch's
            rows = Tensor.arange(count).reshape(count, 1)
            weight = (rows == padding_idx % count).where(0.0, weight)
        self.weight = weight.realize().requires_grad_()
        self.padding_idx = padding_idx

    def forward(self, index: Tensor) -> Tensor:
        return F.embedding(index, self.weight, self.padding_idx)


# -- safetensors files, through the safetensors library ------------------------------------------

# the file's dtype codes, by portkit dtype name
_CODES = {"bool": "BOOL", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
          "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16",
          "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_NAMES = {code: name for name, code in _CODES.items()}


def _safetensors():
    try:
        import safetensors
    except ImportError as error:
        raise ImportError("reading and writing .safetensors files needs the safetensors "
                          "package: pip install 'portkit[safetensors]'") from error
    return safetensors


def save_safetensors(state: dict[str, Tensor], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """Writes tensors (a state_dict) and optional text metadata to a .safetensors file."""
    library = _safetensors()
    arrays = {name: np.ascontiguousarray(tensor.numpy()) for name, tensor in state.items()}
    # the specs point into `arrays`, which stays alive until the file is written
    specs = {name: library.TensorSpec(dtype=array.dtype.name, shape=array.shape,
                                      data_ptr=array.ctypes.data, data_len=array.nbytes)
             for name, array in arrays.items()}
    library.serialize_file(specs, str(path), metadata=metadata)


def load_safetensors(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Reads a .safetensors file into Tensors on `device` (the default device if None), by
    name; a malformed file raises safetensors' SafetensorError."""
    library = _safetensors()
    out = {}
    for name, info in library.deserialize(Path(path).read_bytes()):
        if info["dtype"] not in _NAMES:
            raise TypeError(f"load_safetensors: {name} has dtype {info['dtype']}, which portkit "
                            f"has no type for (it reads {', '.join(sorted(_NAMES))})")
        dtype = dtypes.by_name(_NAMES[info["dtype"]])
        array = np.frombuffer(info["data"], dtype.np).reshape(info["shape"])
        out[name] = Tensor(array, dtype, device)
    return out


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The text metadata of a .safetensors file (empty if it has none)."""
    with _safetensors().safe_open(str(path), framework="numpy") as file:
        return file.metadata() or {}


# after Module: the containers and layers subclass it
from portkit.nn.containers import (
    ELU,
    GELU,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    Dropout,
    Flatten,
    Hardswish,
    LeakyReLU,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    Mish,
    ModuleList,
    ReLU,
    ReLU6,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Tanh,
    Upsample,
)
from portkit.nn.layers import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    GroupNorm,
    PReLU,
    RMSNorm,
)

__all__ = [
    "ELU",
    "GELU",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Dropout",
    "Embedding",
    "Flatten",
    "GroupNorm",
    "Hardswish",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "Mish",
    "Module",
    "ModuleList",
    "PReLU",
    "RMSNorm",
    "ReLU",
    "ReLU6",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softmin",
    "Softplus",
    "Tanh",
    "Upsample",
    "load_safetensors",
    "safetensors_metadata",
    "save_safetensors",
    "uniform_parameter",
]
